// XLA FFI handler symbols of the FP8 targets (handlers/fp8.cu), for module.cc.
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeFwdFp8Cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeFwdTrainFp8Cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeBwdFp8Cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMoeBwdSavedFp8Cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokQuantizeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokQuantizeWeightCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokQuantizeWeightBothCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokMxQdqCuda);
