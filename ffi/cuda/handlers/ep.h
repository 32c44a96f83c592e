// FFI handlers of the peer transport (platform "CUDA"): mok_ep_dispatch, mok_ep_combine and
// mok_home_sum (ep.cu), the fused mok_ep_moe_fwd / mok_ep_moe_fwd_train / mok_ep_moe_bwd
// (ep_fused.cu). Operands, attributes and errors: docs/ffi-contract.md, docs/peer-transport.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpDispatchCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpCombineCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpMoeFwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokHomeSumCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpMoeFwdTrainCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpMoeBwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpMoeFwdTrainRecomputeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MokEpMoeBwdRecomputeCuda);

namespace mok::cuda::ep {
// One message per (workspace, device) of this process whose error word is set or that an error
// poisoned (host/peer_call.cu): what a deferred check reports, and _mok_cuda.peer_errors().
std::vector<std::string> PendingErrors();
}  // namespace mok::cuda::ep

#ifdef __CUDACC__
namespace mok::cuda::ep {
struct Exchange;
// home_row [T, EP] i32 and y [T, H] f32 of a combine.
xla::ffi::Error CheckCombineShapes(int ep, const xla::ffi::AnyBuffer& home_row,
                                   const xla::ffi::AnyBuffer& y, int64_t H);
// Points the exchange's reduction at home_row and y.
void SetReduction(const xla::ffi::AnyBuffer& home_row, xla::ffi::AnyBuffer& y, int64_t H,
                  Exchange* p);
}  // namespace mok::cuda::ep
#endif
