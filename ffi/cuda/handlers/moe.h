// The CUDA handlers of the FFI targets in docs/ffi-contract.md (platform "CUDA").
#pragma once

#include <string>

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeFwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeBwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeFwdTrainCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeBwdSavedCuda);
// mxfp8 through the BF16 GEMMs (phases.h).
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeFwdMxCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeFwdTrainMxCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeBwdSavedMxCuda);

namespace mok::cuda {
// What this build contains, for `_mok_cuda.device_info()`.
std::string CompiledArchitectures();
bool HasWgmmaPath();
}  // namespace mok::cuda
