#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* MokMoeFwdCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* MokMoeBwdCpu(XLA_FFI_CallFrame* call_frame);
}
