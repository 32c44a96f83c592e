// Python module `jax_mok._mok_cuda`: hands the CUDA handlers to jax_mok._ffi as capsules.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "cuda/handlers.h"

namespace nb = nanobind;

namespace {
nb::capsule Capsule(XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_mok_cuda, m) {
  m.doc() = "jax_mok XLA FFI handlers for the CUDA platform (sm_90a kernels)";
  m.def("registrations", [] {
    nb::dict d;
    d["mok_moe_fwd"] = Capsule(MokMoeFwdCuda);
    d["mok_moe_bwd"] = Capsule(MokMoeBwdCuda);
    return d;
  });
  m.def("device_info", [] {
    nb::dict d;
    d["compiled_arch"] = mok::cuda::CompiledArchitectures();
    d["wgmma_path"] = mok::cuda::HasWgmmaPath();
    d["gemm_path_env"] = "JAX_MOK_CUDA_GEMM=simt forces the SIMT oracle for bf16";
    d["weight_tiles_env"] = "weight tiles by TMA; JAX_MOK_CUDA_TMA=0 uses cp.async";
    return d;
  });
}
