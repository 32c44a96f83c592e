// The environment variables the native code reads, and the only getenv in ffi/. Each is a
// debugging or measurement aid that never changes a result (tuning reaches the kernels as FFI
// attributes, docs/ffi-contract.md). Read once per process, parsed strictly: a value outside the
// accepted set is an error (the handlers return it as an ffi::Error naming the variable), never
// silently ignored.
//
//   variable                  accepted values                       effect
//   JAX_MOK_CUDA_DEBUG_SYNC   0 1 false true off on (default 0)     CUDA: synchronize after every
//                                                                   phase, print its name and
//                                                                   status
//   JAX_MOK_CUDA_PROFILE      0 1 false true off on (default 0)     CUDA: per-phase device time on
//                                                                   stderr (serializes the call)
//   JAX_MOK_CPU_THREADS       an integer in [1, 1024]               CPU: worker threads (default:
//                             (default: unset)                      the hardware threads, <= 64)
// An empty value counts as unset. Letter case is ignored in the boolean words.
#pragma once

#include <cstdlib>
#include <string>

#include "common/check.h"

namespace mok::env {

struct Settings {
  bool cuda_debug_sync = false;
  bool cuda_profile = false;
  int cpu_threads = 0;  // 0: not set
  std::string error;    // the first value that did not parse ("" when all did)
};

namespace detail {

inline std::string Lower(const char* s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

inline void ReadBool(const char* name, bool* out, std::string* error) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || raw[0] == '\0') return;
  const std::string v = Lower(raw);
  if (v == "1" || v == "true" || v == "on") {
    *out = true;
  } else if (v == "0" || v == "false" || v == "off") {
    *out = false;
  } else if (error->empty()) {
    *error = StrCat("jax_mok: environment variable ", name, "=", raw,
                    " is not one of 0, 1, false, true, off, on");
  }
}

inline void ReadInt(const char* name, int lo, int hi, int* out, std::string* error) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || raw[0] == '\0') return;
  long long v = 0;
  bool ok = true;
  for (const char* c = raw; *c; ++c) {
    if (*c < '0' || *c > '9' || v > hi) {
      ok = false;
      break;
    }
    v = 10 * v + (*c - '0');
  }
  if (ok && v >= lo && v <= hi) {
    *out = static_cast<int>(v);
  } else if (error->empty()) {
    *error = StrCat("jax_mok: environment variable ", name, "=", raw, " is not an integer in [", lo,
                    ", ", hi, "]");
  }
}

}  // namespace detail

// The settings, parsed on first use (thread-safe) and kept for the life of the process.
inline const Settings& Get() {
  static const Settings settings = [] {
    Settings s;
    detail::ReadBool("JAX_MOK_CUDA_DEBUG_SYNC", &s.cuda_debug_sync, &s.error);
    detail::ReadBool("JAX_MOK_CUDA_PROFILE", &s.cuda_profile, &s.error);
    detail::ReadInt("JAX_MOK_CPU_THREADS", 1, 1024, &s.cpu_threads, &s.error);
    return s;
  }();
  return settings;
}

// Success, or InvalidArgument naming the first variable with a bad value (every handler checks
// this before it runs, so a typo in a debugging switch is reported, not ignored).
inline ffi::Error Status() {
  const Settings& s = Get();
  if (s.error.empty()) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(s.error);
}

}  // namespace mok::env
