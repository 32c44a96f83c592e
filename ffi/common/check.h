// Error plumbing shared by the CPU and CUDA handlers: every failed precondition becomes an
// ffi::Error that names the operand and the values, which JAX raises as a Python exception.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "xla/ffi/api/ffi.h"

namespace mok {

namespace ffi = xla::ffi;

// Formats without iostreams: an ostringstream inside the extension crashed on the GPU machine
// (seen 2026-11-29, libstdc++ locale state shared with jaxlib), and error paths must never crash.
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
