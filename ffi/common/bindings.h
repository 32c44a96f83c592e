// The operand lists of mok_moe_fwd / mok_moe_bwd (docs/ffi-contract.md), written once for every
// backend: a backend binds its context (stream, scratch, ...) first, then appends these.
#pragma once

#include <utility>

#include "xla/ffi/api/ffi.h"

namespace mok {

// Building blocks (taking the binding by reference: a Binding cannot be copied or moved into a
// by-value parameter, only chained).
// The five operands of the layer, in order: x [T, H], topk_ids [T, k] i32, topk_weights [T, k] f32,
// w_gate_up [E, H, 2F], w_down [E, F, H].
template <typename Binding>
auto AppendLayerArgs(Binding&& binding) {
  using xla::ffi::AnyBuffer;
  return std::move(binding)
      .template Arg<AnyBuffer>()
      .template Arg<AnyBuffer>()
      .template Arg<AnyBuffer>()
      .template Arg<AnyBuffer>()
      .template Arg<AnyBuffer>();
}

// The backward's results: dx [T, H], d_topk_weights [T, k] f32, d_w_gate_up [E, H, 2F],
// d_w_down [E, F, H].
template <typename Binding>
auto AppendGradientRets(Binding&& binding) {
  using xla::ffi::AnyBuffer;
  return std::move(binding)
      .template Ret<AnyBuffer>()
      .template Ret<AnyBuffer>()
      .template Ret<AnyBuffer>()
      .template Ret<AnyBuffer>();
}

// mok_moe_fwd: the layer's operands -> y [T, H].
template <typename Binding>
auto BindForwardOperands(Binding binding) {
  return AppendLayerArgs(std::move(binding)).template Ret<xla::ffi::AnyBuffer>();
}

// mok_moe_bwd: dy [T, H], then the layer's operands -> the gradients.
template <typename Binding>
auto BindBackwardOperands(Binding binding) {
  return AppendGradientRets(
      AppendLayerArgs(std::move(binding).template Arg<xla::ffi::AnyBuffer>()));
}

// mok_moe_fwd_train: the forward's operands -> y [T, H] and the gate/up pre-activations
// h [T*k, 2F] (x's dtype, expert-sorted row order), for mok_moe_bwd_saved.
template <typename Binding>
auto BindForwardTrainOperands(Binding binding) {
  using xla::ffi::AnyBuffer;
  return AppendLayerArgs(std::move(binding)).template Ret<AnyBuffer>().template Ret<AnyBuffer>();
}

// mok_moe_bwd_saved: the backward's operands plus h from mok_moe_fwd_train (after w_down).
template <typename Binding>
auto BindBackwardSavedOperands(Binding binding) {
  using xla::ffi::AnyBuffer;
  return AppendGradientRets(
      AppendLayerArgs(std::move(binding).template Arg<AnyBuffer>()).template Arg<AnyBuffer>());
}

}  // namespace mok
