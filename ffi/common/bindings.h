// The operand and attribute lists of the FFI targets (docs/ffi-contract.md), written once for
// every backend: a backend binds its context (stream, scratch, ...) first, then appends these.
// XLA matches attributes by name, and a call must pass exactly the bound ones: a missing or an
// extra attribute fails the call with XLA's decoding error naming the attribute.
#pragma once

#include <cstdint>
#include <utility>

#include "common/check.h"
#include "xla/ffi/api/ffi.h"

namespace mok {

// ------------------------------------------------------------------ attributes
// Kernel choices of mok_moe_fwd / _fwd_train / _bwd / _bwd_saved and the three fused peer calls
// (Python resolves every heuristic; the values reach the handler as they are).
struct KernelOptions {
  // 1: the forward copies x once into expert order so that the gate/up GEMM loads A by TMA (pays
  // for long GEMMs: large F, many rows per expert), the backward copies x and dy so that its
  // weight-gradient GEMMs and dy·Wd^T load them by TMA; 0: those GEMMs gather rows as they load
  // them. Only the CUDA wgmma path reads it; Python resolves it per target (jax_mok.tuning).
  int32_t pregather_x = 0;
  // 0: auto (the wgmma tensor-core kernels for bfloat16, the SIMT kernels for float32);
  // 1: the SIMT kernels for every dtype (the test oracle of the wgmma path). CPU: ignored.
  int32_t gemm = 0;
};
constexpr int32_t kGemmAuto = 0, kGemmSimt = 1;

inline ffi::Error ReadKernelOptions(int32_t pregather_x, int32_t gemm, KernelOptions* out) {
  MOK_CHECK(pregather_x == 0 || pregather_x == 1,
            "attribute pregather_x must be 0 (off) or 1 (on), got ", pregather_x);
  MOK_CHECK(gemm == kGemmAuto || gemm == kGemmSimt,
            "attribute gemm must be 0 (auto: wgmma for bfloat16) or 1 (the SIMT oracle), got ",
            gemm);
  out->pregather_x = pregather_x;
  out->gemm = gemm;
  return ffi::Error::Success();
}

// Appends the KernelOptions attributes; the handler takes (int32_t pregather_x, int32_t gemm)
// after its operands.
template <typename Binding>
auto AppendKernelAttrs(Binding&& binding) {
  return std::move(binding).template Attr<int32_t>("pregather_x").template Attr<int32_t>("gemm");
}

// The peer transport's attributes (CUDA only; decoded by cuda/host/peer_call.h: PeerOptions):
// workspace_id (int64), copy_engine (int32: 1 copy engines, 0 SM stores), sync_check (int32: 1
// synchronize after the call and report its error, 0 report it at the next call), timeout_ms
// (int64 > 0: the bound of every wait for a peer), ctas_per_sm (int32 in [1, 4]: the exchange
// kernel's grid). The handler takes them in this order after its operands.
template <typename Binding>
auto AppendPeerAttrs(Binding&& binding) {
  return std::move(binding)
      .template Attr<int64_t>("workspace_id")
      .template Attr<int32_t>("copy_engine")
      .template Attr<int32_t>("sync_check")
      .template Attr<int64_t>("timeout_ms")
      .template Attr<int32_t>("ctas_per_sm");
}

// ------------------------------------------------------------------ operands
// Building blocks (taking the binding by reference: a Binding cannot be copied or moved into a
// by-value parameter, only chained).
// `n` operands (AnyBuffer each), for a call whose operand list the helpers below do not spell.
template <int n, typename Binding>
auto AppendBuffers(Binding&& binding) {
  static_assert(n >= 1, "AppendBuffers appends at least one operand");
  if constexpr (n == 1)
    return std::move(binding).template Arg<xla::ffi::AnyBuffer>();
  else
    return AppendBuffers<n - 1>(std::move(binding).template Arg<xla::ffi::AnyBuffer>());
}

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

// mok_moe_fwd: the layer's operands -> y [T, H]; KernelOptions.
template <typename Binding>
auto BindForward(Binding binding) {
  return AppendKernelAttrs(AppendLayerArgs(std::move(binding)).template Ret<xla::ffi::AnyBuffer>());
}

// mok_moe_bwd: dy [T, H], then the layer's operands -> the gradients; KernelOptions.
template <typename Binding>
auto BindBackward(Binding binding) {
  return AppendKernelAttrs(
      AppendGradientRets(AppendLayerArgs(std::move(binding).template Arg<xla::ffi::AnyBuffer>())));
}

// mok_moe_fwd_train: the forward's operands -> y [T, H] and the gate/up pre-activations
// h [T*k, 2F] (x's dtype, expert-sorted row order), for mok_moe_bwd_saved; KernelOptions.
template <typename Binding>
auto BindForwardTrain(Binding binding) {
  using xla::ffi::AnyBuffer;
  return AppendKernelAttrs(
      AppendLayerArgs(std::move(binding)).template Ret<AnyBuffer>().template Ret<AnyBuffer>());
}

// mok_moe_bwd_saved: the backward's operands plus h from mok_moe_fwd_train (after w_down);
// KernelOptions.
template <typename Binding>
auto BindBackwardSaved(Binding binding) {
  using xla::ffi::AnyBuffer;
  return AppendKernelAttrs(AppendGradientRets(
      AppendLayerArgs(std::move(binding).template Arg<AnyBuffer>()).template Arg<AnyBuffer>()));
}

}  // namespace mok
