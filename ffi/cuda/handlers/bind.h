// The XLA context every CUDA handler binds before its operands (common/bindings.h appends those).
#pragma once

#include <cuda_runtime.h>

#include "xla/ffi/api/ffi.h"

namespace mok::cuda {

// XLA's stream and the device ordinal.
inline auto BindStreamDevice() {
  return xla::ffi::Ffi::Bind()
      .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
      .Ctx<xla::ffi::DeviceOrdinal>();
}

// XLA's stream, its scratch allocator and the device ordinal: the calls that run the single-GPU
// phases (which carve their scratch from XLA's allocator).
inline auto BindStreamScratchDevice() {
  return xla::ffi::Ffi::Bind()
      .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
      .Ctx<xla::ffi::ScratchAllocator>()
      .Ctx<xla::ffi::DeviceOrdinal>();
}

}  // namespace mok::cuda
