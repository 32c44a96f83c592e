// Host-side status plumbing of the CUDA handlers: error text, launch checks, and the optional
// per-phase synchronization used for debugging (JAX_MOK_CUDA_DEBUG_SYNC=1).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "xla/ffi/api/ffi.h"

namespace mok::cuda {

namespace ffi = xla::ffi;

// Error text without iostreams: a libstdc++ linked statically into this module (seen with the
// GPU machine's toolchain) crashes in std::ostream's locale facets inside XLA's process.
inline void Append(std::string& s, const char* v) { s += v; }
inline void Append(std::string& s, const std::string& v) { s += v; }
template <class N, std::enable_if_t<std::is_arithmetic_v<N>, int> = 0>
void Append(std::string& s, N v) {
  s += std::to_string(v);
}
template <class... Args>
std::string Msg(const Args&... args) {
  std::string s;
  (Append(s, args), ...);
  return s;
}

#define MOK_CUDA_CHECK(cond, ...)                                                   \
  do {                                                                              \
    if (!(cond)) return ffi::Error::InvalidArgument(Msg("jax_mok: ", __VA_ARGS__)); \
  } while (0)

#define MOK_CUDA_RETURN(expr)                                                       \
  do {                                                                              \
    cudaError_t mok_err_ = (expr);                                                  \
    if (mok_err_ != cudaSuccess)                                                    \
      return ffi::Error::Internal(                                                  \
          Msg("jax_mok CUDA: ", #expr, " failed: ", cudaGetErrorString(mok_err_))); \
  } while (0)

// JAX_MOK_CUDA_DEBUG_SYNC=1: synchronize after every phase and name the phase that failed
// (debugging only: a host sync per phase).
inline bool DebugSync() {
  static const bool on = [] {
    const char* env = std::getenv("JAX_MOK_CUDA_DEBUG_SYNC");
    return env && env[0] == '1';
  }();
  return on;
}

// JAX_MOK_CUDA_PROFILE=1: per-phase device time (CUDA events, one host sync per phase) printed
// to stderr as "jax_mok CUDA profile: <phase> <ms>" (measurement only: it serializes the call).
inline bool ProfilePhases() {
  static const bool on = [] {
    const char* env = std::getenv("JAX_MOK_CUDA_PROFILE");
    return env && env[0] == '1';
  }();
  return on;
}

inline cudaEvent_t& ProfileMark() {
  static thread_local cudaEvent_t mark = nullptr;
  return mark;
}

// Starts the clock of a call's first phase (a no-op unless JAX_MOK_CUDA_PROFILE=1).
inline void ProfileStart(cudaStream_t stream) {
  if (!ProfilePhases()) return;
  cudaEvent_t& mark = ProfileMark();
  if (!mark && cudaEventCreate(&mark) != cudaSuccess) return;
  cudaEventRecord(mark, stream);
}

inline void ProfileLap(const char* name, cudaStream_t stream) {
  cudaEvent_t& mark = ProfileMark();
  if (!ProfilePhases() || !mark) return;
  cudaEvent_t now;
  if (cudaEventCreate(&now) != cudaSuccess) return;
  cudaEventRecord(now, stream);
  float ms = -1.f;
  if (cudaEventSynchronize(now) == cudaSuccess) cudaEventElapsedTime(&ms, mark, now);
  std::fprintf(stderr, "jax_mok CUDA profile: %-34s %9.3f ms\n", name, ms);
  cudaEventDestroy(mark);
  mark = now;
}

inline ffi::Error Stage(const char* name, cudaError_t launched, cudaStream_t stream) {
  if (launched != cudaSuccess)
    return ffi::Error::Internal(
        Msg("jax_mok CUDA: launching ", name, " failed: ", cudaGetErrorString(launched)));
  ProfileLap(name, stream);
  if (DebugSync()) {
    std::fprintf(stderr, "jax_mok CUDA: %s ...", name);
    const cudaError_t err = cudaStreamSynchronize(stream);
    std::fprintf(stderr, " %s\n", cudaGetErrorString(err));
    if (err != cudaSuccess)
      return ffi::Error::Internal(
          Msg("jax_mok CUDA: ", name, " failed: ", cudaGetErrorString(err)));
  }
  return ffi::Error::Success();
}

struct DeviceInfo {
  int major = 0, minor = 0, sms = 0;
};

}  // namespace mok::cuda
