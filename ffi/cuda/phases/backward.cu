// The backward phases (phases.h). A translation unit of its own so that the forward and backward
// kernels compile in parallel.
#include "cuda/device/fp8_quantize.cuh"
#include "cuda/host/launch.h"
#include "cuda/phases/phases.h"

namespace mok::cuda {

template <class T>
ffi::Error Backward(cudaStream_t stream, ffi::ScratchAllocator& scratch, const Plan& plan,
                    const Problem& pr, const T* dy, const T* x, const int* ids, const float* w,
                    const T* wgu, const T* wd, T* dx, float* d_w, T* d_wgu, T* d_wd,
                    const T* h_saved, const T* dy_mx, bool qdq_weights) {
  const int64_t TK = pr.assignments(), H = pr.hidden, F = pr.ffn, E = pr.experts;
  const bool mx = dy_mx != nullptr;  // mxfp8 through the BF16 GEMMs (phases.h)
  if (mx) {
    MOK_CHECK((std::is_same_v<T, bf16>) && plan.wgmma,
              "mxfp8 through the BF16 GEMMs needs bf16 x and the wgmma kernels");
    MOK_CHECK(h_saved != nullptr, "mxfp8 through the BF16 GEMMs needs the saved h");
  }
  const int bn = plan.wgmma ? kWgmmaBN : kSimtBN;
  const int g_tiles = CeilDiv(F, bn);
  // wgmma, Plan::pregather_x: x and dy copied once into expert order; every GEMM below reads the
  // copies, the weight-gradient GEMMs (both operands) and dy·Wd^T (A) by TMA. Otherwise no copy
  // is made: the producers gather the rows themselves (routed-M A of the recompute and of
  // dy·Wd^T; routed-K x of dWgu, dy of dWd).
  const bool pregather = std::is_same_v<T, bf16> && plan.pregather_x;
  struct Buffers {
    Routing r;
    const T* h;      // [P, 2F] gate/up pre-activations (saved by the forward, or recomputed)
    T* h_scratch;    // where the recompute writes h (nullptr when saved)
    T* dh;           // [P, 2F]
    T* dh_mx;        // [P, 2F] deq(Q(dh)), dh·Wgu^T's A (mx only)
    T* w_mx;         // [E, H, 2F]: w_down's, then w_gate_up's deq(Q(.)) (mx, qdq_weights only)
    T* aw;           // [P, F]  w · a
    T* dx_part;      // [P, H]
    float* dw_part;  // [P, g_tiles]
    T* x_sorted;     // [P, H] x[sorted_token] (pregather only)
    T* dy_sorted;    // [P, H] dy[sorted_token] (pregather only)
  } b;
  MOK_RETURN_IF_ERROR(CarveScratch(scratch, [&](Carve& c) {
    b.r = CarveRouting(c, pr, ids);
    b.h_scratch = h_saved ? nullptr : c.take<T>(TK * 2 * F);
    b.h = h_saved ? h_saved : b.h_scratch;
    b.dh = c.take<T>(TK * 2 * F);
    b.dh_mx = mx ? c.take<T>(TK * 2 * F) : nullptr;
    b.w_mx = mx && qdq_weights ? c.take<T>(E * H * 2 * F) : nullptr;
    b.aw = c.take<T>(TK * F);
    b.dx_part = c.take<T>(TK * H);
    b.dw_part = c.take<float>(TK * g_tiles);
    b.x_sorted = pregather ? c.take<T>(TK * H) : nullptr;
    b.dy_sorted = pregather ? c.take<T>(TK * H) : nullptr;
  }));
  const Routing& r = b.r;
  const ExpertOrderRows x_rows = InExpertOrder(x, b.x_sorted, r);
  const ExpertOrderRows dy_rows = InExpertOrder(dy, b.dy_sorted, r);
  ProfileStart(stream);
  MOK_RETURN_IF_ERROR(Stage("routing", build_routing(r, stream), stream));
  if (pregather)
    MOK_RETURN_IF_ERROR(GatherXDy<T>(r, x, dy, H, b.x_sorted, b.dy_sorted, plan.sms, stream));

  if (!h_saved) {
    GemmParams g1 = RoutedMParams(r, w, 0);  // h = x[tok] @ Wgu[e]  (stored in x's dtype)
    g1.N = F, g1.K = H, g1.glu = true, g1.glu_offset = F, g1.n_tiles = CeilDiv(F, bn / 2);
    g1.a = x_rows.base, g1.a_gather = x_rows.gather, g1.lda = H, g1.a_rows = TK;
    g1.b = wgu, g1.b_expert_stride = H * 2 * F, g1.ldb = 2 * F;
    g1.out = b.h_scratch, g1.ldo = 2 * F;
    MOK_RETURN_IF_ERROR((RunGemm<T, Mode::kRoutedBN, Epi::kStoreGLU>(
        {"gate/up GEMM (recompute)", "x", "w_gate_up"}, g1, plan, stream)));
  }

  GemmParams g2 = RoutedMParams(r, w, 1);  // g = dy[tok] @ Wd[e]^T → dh, w·a, d_w partials
  g2.N = F, g2.K = H, g2.n_tiles = g_tiles;
  // mx: the quantized dy, gathered by the producers (dy's expert-order copy is dWd's operand).
  const ExpertOrderRows g2_rows =
      mx ? InExpertOrder(dy_mx, static_cast<const T*>(nullptr), r) : dy_rows;
  g2.a = g2_rows.base, g2.a_gather = g2_rows.gather, g2.lda = H, g2.a_rows = TK;
  // mx, qdq_weights: w_down along H made here, in the scratch w_gate_up's reuses after this GEMM
  // (stream order), so the backward holds one weight layout at a time, not two.
  if constexpr (std::is_same_v<T, bf16>) {
    if (b.w_mx)
      MOK_RETURN_IF_ERROR(Stage("mxfp8 quantize-dequantize w_down along H",
                                fp8::launch_mx_qdq(wd, b.w_mx, E * F * H, stream), stream));
  }
  g2.b = b.w_mx ? b.w_mx : wd, g2.b_expert_stride = F * H, g2.ldb = H;
  g2.out = b.dh, g2.out2 = b.aw, g2.h = b.h, g2.dw_part = b.dw_part, g2.ldo = 2 * F;
  MOK_RETURN_IF_ERROR((RunGemm<T, Mode::kRoutedBK, Epi::kSwiGLUBwd>(
      {"dy Wd^T GEMM + SwiGLU bwd", "dy", "w_down"}, g2, plan, stream)));

  if constexpr (std::is_same_v<T, bf16>) {
    if (mx)
      MOK_RETURN_IF_ERROR(Stage("mxfp8 quantize-dequantize dh",
                                fp8::launch_mx_qdq(b.dh, b.dh_mx, TK * 2 * F, stream), stream));
    if (b.w_mx)
      MOK_RETURN_IF_ERROR(Stage("mxfp8 quantize-dequantize w_gate_up along 2F",
                                fp8::launch_mx_qdq(wgu, b.w_mx, E * H * 2 * F, stream), stream));
  }

  GemmParams g3 = RoutedMParams(r, w, 2);  // dx_part = dh @ Wgu[e]^T
  g3.N = H, g3.K = 2 * F, g3.n_tiles = CeilDiv(H, bn);
  g3.a = mx ? b.dh_mx : b.dh, g3.lda = 2 * F, g3.a_rows = TK;
  g3.b = b.w_mx ? b.w_mx : wgu, g3.b_expert_stride = H * 2 * F, g3.ldb = 2 * F;
  g3.out = b.dx_part, g3.ldo = H;
  MOK_RETURN_IF_ERROR((RunGemm<T, Mode::kRoutedBK, Epi::kStoreRows>(
      {"dh Wgu^T GEMM", "dh", "w_gate_up"}, g3, plan, stream)));

  MOK_RETURN_IF_ERROR(
      CombineGradients<T>(r, pr, b.dx_part, dx, b.dw_part, d_w, g_tiles, plan.sms, stream));

  return WeightGradients<T>(stream, plan, r, w, TK, H, F, x_rows, dy_rows, b.aw, b.dh, d_wgu, d_wd);
}

template <class T>
ffi::Error WeightGradients(cudaStream_t stream, const Plan& plan, const Routing& r,
                           const float* topk_weights, int64_t assignments, int64_t hidden,
                           int64_t ffn, ExpertOrderRows x_rows, ExpertOrderRows dy_rows,
                           const T* aw, const T* dh, T* d_wgu, T* d_wd) {
  const int64_t TK = assignments, H = hidden, F = ffn;
  const int bn = plan.wgmma ? kWgmmaBN : kSimtBN;
  GemmParams g4 = RoutedParams(r, topk_weights);  // dWd[e] = (w·a)^T dy[tok]    [F, H]
  g4.M = F, g4.N = H, g4.m_tiles = CeilDiv(F, kTileM), g4.n_tiles = CeilDiv(H, bn);
  g4.a = aw, g4.lda = F;
  g4.a_rows = TK;  // rows of both operands (the TMA path's tensor maps)
  g4.b = dy_rows.base, g4.b_gather = dy_rows.gather, g4.ldb = H;
  g4.out = d_wd, g4.ldo = H;
  MOK_RETURN_IF_ERROR((RunGemm<T, Mode::kRoutedK, Epi::kStoreCast>(
      {"dWd GEMM", "the weighted activations w·a", "dy"}, g4, plan, stream)));

  GemmParams g5 = RoutedParams(r, topk_weights);  // dWgu[e] = x[tok]^T dh          [H, 2F]
  g5.M = H, g5.N = 2 * F, g5.m_tiles = CeilDiv(H, kTileM), g5.n_tiles = CeilDiv(2 * F, bn);
  g5.a = x_rows.base, g5.a_gather = x_rows.gather, g5.lda = H, g5.a_rows = TK;
  g5.b = dh, g5.ldb = 2 * F;
  g5.out = d_wgu, g5.ldo = 2 * F;
  MOK_RETURN_IF_ERROR(
      (RunGemm<T, Mode::kRoutedK, Epi::kStoreCast>({"dWgu GEMM", "x", "dh"}, g5, plan, stream)));
  return ffi::Error::Success();
}

template ffi::Error Backward<bf16>(cudaStream_t, ffi::ScratchAllocator&, const Plan&,
                                   const Problem&, const bf16*, const bf16*, const int*,
                                   const float*, const bf16*, const bf16*, bf16*, float*, bf16*,
                                   bf16*, const bf16*, const bf16*, bool);
template ffi::Error Backward<float>(cudaStream_t, ffi::ScratchAllocator&, const Plan&,
                                    const Problem&, const float*, const float*, const int*,
                                    const float*, const float*, const float*, float*, float*,
                                    float*, float*, const float*, const float*, bool);
template ffi::Error WeightGradients<bf16>(cudaStream_t, const Plan&, const Routing&, const float*,
                                          int64_t, int64_t, int64_t, ExpertOrderRows,
                                          ExpertOrderRows, const bf16*, const bf16*, bf16*, bf16*);
template ffi::Error WeightGradients<float>(cudaStream_t, const Plan&, const Routing&, const float*,
                                           int64_t, int64_t, int64_t, ExpertOrderRows,
                                           ExpertOrderRows, const float*, const float*, float*,
                                           float*);

}  // namespace mok::cuda
