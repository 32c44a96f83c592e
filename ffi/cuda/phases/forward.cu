// The forward phases (phases.h). A translation unit of its own so that the forward and backward
// kernels compile in parallel.
#include "cuda/host/launch.h"
#include "cuda/phases/phases.h"

namespace mok::cuda {

template <class T>
ffi::Error Forward(cudaStream_t stream, ffi::ScratchAllocator& scratch, const Plan& plan,
                   const Problem& pr, const T* x, const int* ids, const float* w, const T* wgu,
                   const T* wd, T* y, T* h_save, bool mx_act) {
  const int64_t TK = pr.assignments(), H = pr.hidden, F = pr.ffn;
  const bool pregather = std::is_same_v<T, bf16> && plan.pregather_x;
  Routing r;
  T* act;
  T* y_part;
  T* x_sorted = nullptr;  // [P, H] x[sorted_token] (pregather only)
  MOK_RETURN_IF_ERROR(CarveScratch(scratch, [&](Carve& c) {
    r = CarveRouting(c, pr, ids);
    act = c.take<T>(TK * F);     // [P, F]
    y_part = c.take<T>(TK * H);  // [P, H] w · (a @ Wd[e]) per assignment
    x_sorted = pregather ? c.take<T>(TK * H) : nullptr;
  }));

  const int bn = plan.wgmma ? kWgmmaBN : kSimtBN;
  ProfileStart(stream);
  MOK_RETURN_IF_ERROR(Stage("routing", build_routing(r, stream), stream));
  if (pregather)
    MOK_RETURN_IF_ERROR(Stage("gather x into expert order",
                              launch_to_expert_order<T>(r, x, x_sorted, nullptr, nullptr,
                                                        static_cast<int>(H), plan.sms, stream),
                              stream));

  GemmParams g1 = RoutedMParams(r, w, 0);  // h = x[tok] @ Wgu[e] → a = silu(h_g) h_u
  g1.N = F, g1.K = H, g1.glu = true, g1.glu_offset = F, g1.n_tiles = CeilDiv(F, bn / 2);
  const ExpertOrderRows x_rows = InExpertOrder(x, x_sorted, r);
  g1.a = x_rows.base, g1.a_gather = x_rows.gather, g1.lda = H, g1.a_rows = TK;
  g1.b = wgu, g1.b_expert_stride = H * 2 * F, g1.ldb = 2 * F;
  g1.out = act, g1.ldo = F, g1.out2 = h_save;
  if (mx_act && h_save) {
    MOK_RETURN_IF_ERROR((RunGemm<T, Mode::kRoutedBN, Epi::kSwiGLUSaveMx>(
        {"gate/up GEMM + SwiGLU, a mxfp8 (h saved)", "x", "w_gate_up"}, g1, plan, stream)));
  } else if (mx_act) {
    MOK_RETURN_IF_ERROR((RunGemm<T, Mode::kRoutedBN, Epi::kSwiGLUMx>(
        {"gate/up GEMM + SwiGLU, a mxfp8", "x", "w_gate_up"}, g1, plan, stream)));
  } else if (h_save) {  // training: keep h for the backward (saves its recompute GEMM)
    MOK_RETURN_IF_ERROR((RunGemm<T, Mode::kRoutedBN, Epi::kSwiGLUSave>(
        {"gate/up GEMM + SwiGLU (h saved)", "x", "w_gate_up"}, g1, plan, stream)));
  } else {
    MOK_RETURN_IF_ERROR((RunGemm<T, Mode::kRoutedBN, Epi::kSwiGLU>(
        {"gate/up GEMM + SwiGLU", "x", "w_gate_up"}, g1, plan, stream)));
  }

  GemmParams g2 = RoutedMParams(r, w, 1);  // y_part = w · (a @ Wd[e])
  g2.N = H, g2.K = F, g2.n_tiles = CeilDiv(H, bn);
  g2.a = act, g2.lda = F, g2.a_rows = TK;
  g2.b = wd, g2.b_expert_stride = F * H, g2.ldb = H;
  g2.out = y_part, g2.ldo = H;
  MOK_RETURN_IF_ERROR((RunGemm<T, Mode::kRoutedBN, Epi::kWeighted>(
      {"down GEMM x weight", "the activations a", "w_down"}, g2, plan, stream)));

  MOK_RETURN_IF_ERROR(
      Stage("combine y",
            launch_combine<T>(y_part, r.assign_pos, y, static_cast<int>(pr.tokens),
                              static_cast<int>(pr.top_k), static_cast<int>(H), plan.sms, stream),
            stream));
  return ffi::Error::Success();
}

template ffi::Error Forward<bf16>(cudaStream_t, ffi::ScratchAllocator&, const Plan&, const Problem&,
                                  const bf16*, const int*, const float*, const bf16*, const bf16*,
                                  bf16*, bf16*, bool);
template ffi::Error Forward<float>(cudaStream_t, ffi::ScratchAllocator&, const Plan&,
                                   const Problem&, const float*, const int*, const float*,
                                   const float*, const float*, float*, float*, bool);

}  // namespace mok::cuda
