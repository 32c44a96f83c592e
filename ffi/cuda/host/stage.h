// The status of one launched phase (Stage), with the two debugging aids of common/env.h:
// JAX_MOK_CUDA_DEBUG_SYNC (a host sync after every phase, naming the phase that failed) and
// JAX_MOK_CUDA_PROFILE (per-phase device time on stderr as "jax_mok CUDA profile: <phase> <ms>").
// Both serialize the call; neither changes a result.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#include "common/check.h"
#include "common/env.h"

namespace mok::cuda {

inline bool DebugSync() { return env::Get().cuda_debug_sync; }

inline cudaEvent_t& ProfileMark() {
  static thread_local cudaEvent_t mark = nullptr;
  return mark;
}

// Starts the clock of a call's first phase (a no-op unless JAX_MOK_CUDA_PROFILE is on).
inline void ProfileStart(cudaStream_t stream) {
  if (!env::Get().cuda_profile) return;
  cudaEvent_t& mark = ProfileMark();
  if (!mark && cudaEventCreate(&mark) != cudaSuccess) return;
  cudaEventRecord(mark, stream);
}

inline void ProfileLap(const char* name, cudaStream_t stream) {
  cudaEvent_t& mark = ProfileMark();
  if (!env::Get().cuda_profile || !mark) return;
  cudaEvent_t now;
  if (cudaEventCreate(&now) != cudaSuccess) return;
  cudaEventRecord(now, stream);
  float ms = -1.f;
  if (cudaEventSynchronize(now) == cudaSuccess) cudaEventElapsedTime(&ms, mark, now);
  std::fprintf(stderr, "jax_mok CUDA profile: %-34s %9.3f ms\n", name, ms);
  cudaEventDestroy(mark);
  mark = now;
}

// `launched`: the launch's own status (cudaGetLastError after it, or the launcher's result).
inline ffi::Error Stage(const char* name, cudaError_t launched, cudaStream_t stream) {
  if (launched != cudaSuccess)
    return ffi::Error::Internal(
        StrCat("jax_mok CUDA: launching ", name, " failed: ", cudaGetErrorString(launched)));
  ProfileLap(name, stream);
  if (DebugSync()) {
    std::fprintf(stderr, "jax_mok CUDA: %s ...", name);
    const cudaError_t err = cudaStreamSynchronize(stream);
    std::fprintf(stderr, " %s\n", cudaGetErrorString(err));
    if (err != cudaSuccess)
      return ffi::Error::Internal(
          StrCat("jax_mok CUDA: ", name, " failed: ", cudaGetErrorString(err)));
  }
  return ffi::Error::Success();
}

}  // namespace mok::cuda
