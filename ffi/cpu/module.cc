// Python module `jax_mok._mok_cpu`: hands the CPU handlers to jax_mok._ffi as capsules.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <stdexcept>
#include <string>

#include "common/env.h"
#include "cpu/handlers.h"
#include "cpu/parallel.h"

namespace nb = nanobind;

namespace {
nb::capsule Capsule(XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_mok_cpu, m) {
  m.doc() = "jax_mok XLA FFI handlers for the CPU platform";
  m.def("registrations", [] {
    nb::dict d;
    d["mok_moe_fwd"] = Capsule(MokMoeFwdCpu);
    d["mok_moe_bwd"] = Capsule(MokMoeBwdCpu);
    return d;
  });
  m.def(
      "num_threads",
      [] {
        const std::string& error = mok::env::Get().error;
        if (!error.empty()) throw std::invalid_argument(error);
        return mok::cpu::NumThreads();
      },
      "Threads the CPU kernels use (JAX_MOK_CPU_THREADS overrides; a bad value raises "
      "ValueError naming it).");
}
