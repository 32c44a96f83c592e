// Error plumbing shared by the CPU and CUDA handlers: every failed precondition becomes an
// ffi::Error that names the operand and the values, which JAX raises as a Python exception.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace mok {

namespace ffi = xla::ffi;

template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace mok

// Returns ffi::Error::InvalidArgument("<message>") from the enclosing handler when cond is false.
#define MOK_CHECK(cond, ...)                                                            \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      return ::xla::ffi::Error::InvalidArgument(::mok::StrCat("jax_mok: ", __VA_ARGS__)); \
    }                                                                                   \
  } while (0)

// Propagates a non-OK ffi::Error from a helper.
#define MOK_RETURN_IF_ERROR(expr)            \
  do {                                       \
    ::xla::ffi::Error mok_error_ = (expr);   \
    if (mok_error_.failure()) return mok_error_; \
  } while (0)
