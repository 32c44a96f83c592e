// The CUDA handlers of the FFI targets in docs/ffi-contract.md (platform "CUDA").
#pragma once

#include <string>

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeFwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeBwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeFwdTrainCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeBwdSavedCuda);

namespace mok::cuda {
// What this build contains, for `_mok_cuda.device_info()`.
std::string CompiledArchitectures();
bool HasWgmmaPath();
}  // namespace mok::cuda
