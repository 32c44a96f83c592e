// FFI handlers of the peer transport (platform "CUDA"): mok_ep_dispatch, mok_ep_combine, the
// fused mok_ep_moe_fwd / mok_ep_moe_fwd_train / mok_ep_moe_bwd, and mok_home_sum.
// Operands, attributes and errors: docs/peer-transport.md. Run on 2 x H200 (2026-11-30).
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpDispatchCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpCombineCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpMoeFwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokHomeSumCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpMoeFwdTrainCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpMoeBwdCuda);
