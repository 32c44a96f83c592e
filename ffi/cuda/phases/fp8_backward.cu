// The FP8 backward:
//   route -> [gate/up GEMM (h), unless saved] -> dy Wd^T GEMM (+ SwiGLU bwd, d_w partials, dh and
//   w*a in T) -> quantize dh along 2F -> dh Wgu^T GEMM -> combine dx, reduce d_w
//   -> quantize w*a and dy along each expert's tokens -> dWd GEMM
//   -> quantize x and dh along each expert's tokens -> dWgu GEMM
// or, with unquantized weight gradients, -> [gather x, dy into expert order] -> the routed-K
// GEMMs in T (backward.cu's WeightGradients).
#include "cuda/phases/fp8_common.cuh"

namespace mok::cuda::fp8 {

template <class T>
ffi::Error Backward8(Recipe recipe, cudaStream_t stream, ffi::ScratchAllocator& scratch,
                     const DeviceInfo& dev, const Problem& pr, const Backward8Operands& op, T* dx,
                     float* d_w, T* d_w_gate_up, T* d_w_down) {
  const int64_t P = pr.assignments(), H = pr.hidden, F = pr.ffn, E = pr.experts;
  // Each expert's positions padded to 128 (fp8_quantize.cuh): at most 127 extra per expert.
  const int64_t padded = CeilDiv(P + E * 127, 128) * int64_t{128};
  const int g_tiles = CeilDiv(F, kBN);  // d_w partials per position (one per n-tile)
  struct {
    Routing r;
    int* k_offset;             // [E+1] padded positions of the weight gradients
    T* h_scratch;              // [P, 2F] recomputed h (nullptr when saved)
    T* dh;                     // [P, 2F]
    T* aw;                     // [P, F] w * a
    T* dx_part;                // [P, H]
    float* dw_part;            // [P, g_tiles]
    uint8_t *dh_q, *dh_s;      // dh along 2F
    uint8_t *tok_h, *tok_h_s;  // dy, then x: [H, padded] along tokens
    uint8_t *tok_f, *tok_f_s;  // w*a [F, padded], then dh [2F, padded] along tokens
    T *x_sorted, *dy_sorted;   // [P, H] x, dy in expert order (pregather only)
  } b;
  const bool unquantized = op.unquantized_weight_grads;
  // The BF16 layer's plan for its weight-gradient GEMMs: wgmma for bf16, else its SIMT kernels;
  // with op.pregather_x, x and dy copied once into expert order so that they load by TMA, else
  // each GEMM gathers its token-order operand (x for dWgu, dy for dWd) itself.
  const Plan plan = ChoosePlan(pr, KernelOptions{.pregather_x = op.pregather_x}, dev);
  const bool pregather = unquantized && plan.pregather_x;
  MOK_RETURN_IF_ERROR(CarveScratch(scratch, [&](Carve& c) {
    b.r = CarveRouting(c, pr, op.ids);
    b.k_offset = c.take<int>(E + 1);
    b.h_scratch = op.h_saved ? nullptr : c.take<T>(P * 2 * F);
    b.dh = c.take<T>(P * 2 * F);
    b.aw = c.take<T>(P * F);
    b.dx_part = c.take<T>(P * H);
    b.dw_part = c.take<float>(P * g_tiles);
    b.dh_q = c.take<uint8_t>(P * 2 * F);
    b.dh_s = c.take<uint8_t>(P * 2 * F / 32);
    b.x_sorted = pregather ? c.take<T>(P * H) : nullptr;
    b.dy_sorted = pregather ? c.take<T>(P * H) : nullptr;
    if (!unquantized) {
      b.tok_h = c.take<uint8_t>(H * padded);
      b.tok_h_s = c.take<uint8_t>(H * padded / 32);
      b.tok_f = c.take<uint8_t>(2 * F * padded);
      b.tok_f_s = c.take<uint8_t>(2 * F * padded / 32);
    }
  }));
  const Routing& r = b.r;
  const T* h = op.h_saved ? static_cast<const T*>(op.h_saved) : b.h_scratch;
  const T* dy = static_cast<const T*>(op.dy);
  const T* x = static_cast<const T*>(op.x);

  ProfileStart(stream);
  MOK_RETURN_IF_ERROR(Stage("routing", build_routing(r, stream), stream));
  MOK_RETURN_IF_ERROR(BuildTokenOffsets(r, b.k_offset, stream));
  return DispatchRecipe(recipe, [&](auto tag) -> ffi::Error {
    constexpr Recipe R = decltype(tag)::value;
    constexpr bool kPerRow = R == Recipe::kMx;
    constexpr auto kM = TileShape::kRoutedM;

    if (!op.h_saved) {  // h = x[tok] @ Wgu[e], stored in T
      Fp8GemmParams g = RoutedFp8(r, op.w, op.x_q, r.sorted_token, F, H, true, 0);
      MOK_RETURN_IF_ERROR(SetOperandB(g, op.w_gate_up_fwd, 2 * F, H, E, !kPerRow, "w_gate_up"));
      g.epi.out = b.h_scratch;
      MOK_RETURN_IF_ERROR(
          Stage("fp8 gate/up GEMM (recompute)",
                launch_fp8_gemm<R, kM, kPerRow, Epi8::kStoreGLU, T>(g, dev.sms, stream), stream));
    }

    // g = dy[tok] @ Wd[e]^T -> dh, w*a, d_w partials
    Fp8GemmParams g2 = RoutedFp8(r, op.w, op.dy_q, r.sorted_token, F, H, false, 1);
    MOK_RETURN_IF_ERROR(SetOperandB(g2, op.w_down_bwd, F, H, E, !kPerRow, "w_down (backward)"));
    g2.epi.out = b.dh, g2.epi.out2 = b.aw, g2.epi.h = h, g2.epi.dw_part = b.dw_part;
    g2.epi.ldo = 2 * F;
    MOK_RETURN_IF_ERROR(
        Stage("fp8 dy Wd^T GEMM + SwiGLU bwd",
              launch_fp8_gemm<R, kM, kPerRow, Epi8::kSwiGLUBwd, T>(g2, dev.sms, stream), stream));

    MOK_RETURN_IF_ERROR(
        Stage("quantize dh",
              launch_quantize_rows<T, R>(b.dh, static_cast<int>(P), r.expert_offset + E,
                                         static_cast<int>(2 * F), b.dh_q, b.dh_s, dev.sms, stream),
              stream));

    // dx_part = dh @ Wgu[e]^T
    Fp8GemmParams g3 = RoutedFp8(r, op.w, Quantized{b.dh_q, b.dh_s}, nullptr, H, 2 * F, false, 2);
    MOK_RETURN_IF_ERROR(
        SetOperandB(g3, op.w_gate_up_bwd, H, 2 * F, E, !kPerRow, "w_gate_up (backward)"));
    g3.epi.out = b.dx_part, g3.epi.ldo = H;
    g3.staged_out = std::is_same_v<T, bf16>;
    MOK_RETURN_IF_ERROR(
        Stage("fp8 dh Wgu^T GEMM",
              launch_fp8_gemm<R, kM, kPerRow, Epi8::kStoreRows, T>(g3, dev.sms, stream), stream));

    MOK_RETURN_IF_ERROR(
        CombineGradients<T>(r, pr, b.dx_part, dx, b.dw_part, d_w, g_tiles, dev.sms, stream));

    if (unquantized) {
      if (pregather)
        MOK_RETURN_IF_ERROR(GatherXDy<T>(r, x, dy, H, b.x_sorted, b.dy_sorted, dev.sms, stream));
      return WeightGradients<T>(stream, plan, r, op.w, P, H, F, InExpertOrder(x, b.x_sorted, r),
                                InExpertOrder(dy, b.dy_sorted, r), b.aw, b.dh, d_w_gate_up,
                                d_w_down);
    }

    // Weight gradients: both operands transposed and quantized along each expert's tokens.
    auto weight_grad = [&](const char* name, const T* a_src, int64_t a_ld, const int* a_gather,
                           int64_t m, uint8_t* a_q, uint8_t* a_s, const T* b_src, int64_t b_ld,
                           const int* b_gather, int64_t n, uint8_t* b_q, uint8_t* b_s,
                           T* out) -> ffi::Error {
      const int experts = static_cast<int>(E);
      cudaError_t err =
          launch_quantize_segments<T, R>(a_src, a_ld, a_gather, r.expert_offset, b.k_offset,
                                         experts, static_cast<int>(m), padded, a_q, a_s, stream);
      if (err == cudaSuccess)
        err =
            launch_quantize_segments<T, R>(b_src, b_ld, b_gather, r.expert_offset, b.k_offset,
                                           experts, static_cast<int>(n), padded, b_q, b_s, stream);
      MOK_RETURN_IF_ERROR(Stage("quantize along tokens", err, stream));
      Fp8GemmParams g{};
      g.k_offset = b.k_offset;
      g.experts = experts;
      g.M = static_cast<int>(m), g.N = static_cast<int>(n);
      g.m_tiles = CeilDiv(m, kBM), g.n_tiles = CeilDiv(n, kBN);
      g.a = a_q, g.lda = padded, g.a_scale = a_s, g.a_scale_ld = padded / 32;
      MOK_RETURN_IF_ERROR(SetOperandB(g, Quantized{b_q, b_s}, n, padded, 1, false, name));
      g.epi = RoutedParams(r, op.w);
      g.epi.M = static_cast<int>(m), g.epi.N = static_cast<int>(n);
      g.epi.n_tiles = g.n_tiles;
      g.epi.out = out, g.epi.ldo = n;
      g.staged_out = std::is_same_v<T, bf16>;
      return Stage(
          name,
          launch_fp8_gemm<R, TileShape::kExpertK, true, Epi8::kStoreCast, T>(g, dev.sms, stream),
          stream);
    };
    // dWd[e] = (w*a)^T dy[tok]    [F, H]
    MOK_RETURN_IF_ERROR(weight_grad("fp8 dWd GEMM", b.aw, F, nullptr, F, b.tok_f, b.tok_f_s, dy, H,
                                    r.sorted_token, H, b.tok_h, b.tok_h_s, d_w_down));
    // dWgu[e] = x[tok]^T dh        [H, 2F]
    return weight_grad("fp8 dWgu GEMM", x, H, r.sorted_token, H, b.tok_h, b.tok_h_s, b.dh, 2 * F,
                       nullptr, 2 * F, b.tok_f, b.tok_f_s, d_w_gate_up);
  });
}

template ffi::Error Backward8<bf16>(Recipe, cudaStream_t, ffi::ScratchAllocator&, const DeviceInfo&,
                                    const Problem&, const Backward8Operands&, bf16*, float*, bf16*,
                                    bf16*);
template ffi::Error Backward8<float>(Recipe, cudaStream_t, ffi::ScratchAllocator&,
                                     const DeviceInfo&, const Problem&, const Backward8Operands&,
                                     float*, float*, float*, float*);

}  // namespace mok::cuda::fp8
