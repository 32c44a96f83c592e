// See device.h.
#include "cuda/host/device.h"

#include <cuda_runtime.h>

#include <mutex>

namespace mok::cuda {

ffi::Error GetDevice(int32_t ordinal, DeviceInfo* info) {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static DeviceInfo cache[kMaxDevices];
  MOK_CHECK(ordinal >= 0 && ordinal < kMaxDevices, "device ordinal must be in [0, ", kMaxDevices,
            "), got ", ordinal);
  {
    std::lock_guard<std::mutex> lock(mu);
    DeviceInfo& c = cache[ordinal];
    if (c.sms == 0) {
      DeviceInfo q;
      MOK_CUDA_RETURN(cudaDeviceGetAttribute(&q.major, cudaDevAttrComputeCapabilityMajor, ordinal));
      MOK_CUDA_RETURN(cudaDeviceGetAttribute(&q.minor, cudaDevAttrComputeCapabilityMinor, ordinal));
      MOK_CUDA_RETURN(cudaDeviceGetAttribute(&q.sms, cudaDevAttrMultiProcessorCount, ordinal));
      MOK_CUDA_RETURN(
          cudaDeviceGetAttribute(&q.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal));
      c = q;  // published whole: a failed query leaves the entry empty
    }
    *info = c;
  }
  int current = -1;
  MOK_CUDA_RETURN(cudaGetDevice(&current));
  if (current != ordinal) MOK_CUDA_RETURN(cudaSetDevice(ordinal));
  if (info->major != 9) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      StrCat("jax_mok CUDA kernels are built for sm_90a (Hopper, compute "
                             "capability 9.0); device ",
                             ordinal, " has compute capability ", info->major, ".", info->minor,
                             ". Use implementation=\"reference\" on this GPU."));
  }
  return ffi::Error::Success();
}

}  // namespace mok::cuda
