// The one per-device cache of the CUDA handlers: what a call needs to know about its GPU.
#pragma once

#include <cstdint>

#include "common/check.h"

namespace mok::cuda {

struct DeviceInfo {
  int major = 0, minor = 0;  // compute capability
  int sms = 0;               // streaming multiprocessors
  int smem_optin = 0;        // bytes of dynamic shared memory a kernel may opt in to per block
};

// The properties of device `ordinal` (queried once per device, then cached), and makes it the
// calling thread's current device (kernel attributes such as the dynamic shared-memory size are
// set per device). kUnimplemented on anything but compute capability 9.x: the kernels are built
// for sm_90a only.
ffi::Error GetDevice(int32_t ordinal, DeviceInfo* info);

}  // namespace mok::cuda
