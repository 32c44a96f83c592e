// The operand lists of mok_moe_fwd / mok_moe_bwd (docs/ffi-contract.md), written once for every
// backend: a backend binds its context (stream, scratch, ...) first, then appends these.
#pragma once

#include <utility>

#include "xla/ffi/api/ffi.h"

namespace mok {

template <typename Binding>
auto BindForwardOperands(Binding binding) {
  using xla::ffi::AnyBuffer;
  return std::move(binding)
      .template Arg<AnyBuffer>()   // x [T, H]
      .template Arg<AnyBuffer>()   // topk_ids [T, k] i32
      .template Arg<AnyBuffer>()   // topk_weights [T, k] f32
      .template Arg<AnyBuffer>()   // w_gate_up [E, H, 2F]
      .template Arg<AnyBuffer>()   // w_down [E, F, H]
      .template Ret<AnyBuffer>();  // y [T, H]
}

template <typename Binding>
auto BindBackwardOperands(Binding binding) {
  using xla::ffi::AnyBuffer;
  return std::move(binding)
      .template Arg<AnyBuffer>()   // dy [T, H]
      .template Arg<AnyBuffer>()   // x [T, H]
      .template Arg<AnyBuffer>()   // topk_ids [T, k] i32
      .template Arg<AnyBuffer>()   // topk_weights [T, k] f32
      .template Arg<AnyBuffer>()   // w_gate_up [E, H, 2F]
      .template Arg<AnyBuffer>()   // w_down [E, F, H]
      .template Ret<AnyBuffer>()   // dx [T, H]
      .template Ret<AnyBuffer>()   // d_topk_weights [T, k] f32
      .template Ret<AnyBuffer>()   // d_w_gate_up [E, H, 2F]
      .template Ret<AnyBuffer>();  // d_w_down [E, F, H]
}

// mok_moe_fwd_train: the forward's operands, and the gate/up pre-activations h [T*k, 2F] (x's
// dtype, expert-sorted row order) as a second result, for mok_moe_bwd_saved.
template <typename Binding>
auto BindForwardTrainOperands(Binding binding) {
  using xla::ffi::AnyBuffer;
  return std::move(binding)
      .template Arg<AnyBuffer>()   // x [T, H]
      .template Arg<AnyBuffer>()   // topk_ids [T, k] i32
      .template Arg<AnyBuffer>()   // topk_weights [T, k] f32
      .template Arg<AnyBuffer>()   // w_gate_up [E, H, 2F]
      .template Arg<AnyBuffer>()   // w_down [E, F, H]
      .template Ret<AnyBuffer>()   // y [T, H]
      .template Ret<AnyBuffer>();  // h [T*k, 2F]
}

// mok_moe_bwd_saved: the backward's operands plus h from mok_moe_fwd_train (after w_down).
template <typename Binding>
auto BindBackwardSavedOperands(Binding binding) {
  using xla::ffi::AnyBuffer;
  return std::move(binding)
      .template Arg<AnyBuffer>()   // dy [T, H]
      .template Arg<AnyBuffer>()   // x [T, H]
      .template Arg<AnyBuffer>()   // topk_ids [T, k] i32
      .template Arg<AnyBuffer>()   // topk_weights [T, k] f32
      .template Arg<AnyBuffer>()   // w_gate_up [E, H, 2F]
      .template Arg<AnyBuffer>()   // w_down [E, F, H]
      .template Arg<AnyBuffer>()   // h [T*k, 2F] from mok_moe_fwd_train
      .template Ret<AnyBuffer>()   // dx [T, H]
      .template Ret<AnyBuffer>()   // d_topk_weights [T, k] f32
      .template Ret<AnyBuffer>()   // d_w_gate_up [E, H, 2F]
      .template Ret<AnyBuffer>();  // d_w_down [E, F, H]
}

}  // namespace mok
