// The one error family of both backends: every failed precondition or failed runtime call becomes
// an ffi::Error whose text names the operand (or call) and the values, which JAX raises as a
// Python exception. Handlers return errors; they never abort the process.
//   MOK_CHECK(cond, parts...)       -> ffi::Error::InvalidArgument("jax_mok: " + parts)
//   MOK_RETURN_IF_ERROR(expr)       -> propagates a failed ffi::Error
//   MOK_CUDA_RETURN(cuda_call)      -> ffi::Error::Internal naming the call and the CUDA error
// MOK_CUDA_RETURN expands only where cuda_runtime.h is included; this header itself needs none.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "xla/ffi/api/ffi.h"

namespace mok {

namespace ffi = xla::ffi;

// Formats without iostreams: a libstdc++ linked statically into an extension module shares
// std::ostream's locale facets with jaxlib's, which crashed inside XLA's process; error paths
// must never crash.
inline void AppendOne(std::string* out, const char* v) { out->append(v); }
inline void AppendOne(std::string* out, const std::string& v) { out->append(v); }
template <typename T>
void AppendOne(std::string* out, T v) {
  static_assert(std::is_arithmetic_v<T>, "StrCat takes strings and numbers");
  out->append(std::to_string(v));
}

template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (AppendOne(&out, args), ...);
  return out;
}

}  // namespace mok

// Returns ffi::Error::InvalidArgument("<message>") from the enclosing handler when cond is false.
#define MOK_CHECK(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      return ::xla::ffi::Error::InvalidArgument(::mok::StrCat("jax_mok: ", __VA_ARGS__)); \
    }                                                                                     \
  } while (0)

// Propagates a non-OK ffi::Error from a helper.
#define MOK_RETURN_IF_ERROR(expr)                \
  do {                                           \
    ::xla::ffi::Error mok_error_ = (expr);       \
    if (mok_error_.failure()) return mok_error_; \
  } while (0)

// Returns ffi::Error::Internal naming the CUDA runtime call and its error when it fails.
#define MOK_CUDA_RETURN(expr)                                                            \
  do {                                                                                   \
    const cudaError_t mok_cuda_error_ = (expr);                                          \
    if (mok_cuda_error_ != cudaSuccess) {                                                \
      return ::xla::ffi::Error::Internal(::mok::StrCat(                                  \
          "jax_mok CUDA: ", #expr, " failed: ", ::cudaGetErrorString(mok_cuda_error_))); \
    }                                                                                    \
  } while (0)
