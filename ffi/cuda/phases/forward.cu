// The forward phases: see moe.cuh for the phase list. A translation unit of its own so that the
// forward and backward kernels compile in parallel.
#include "cuda/host/launch.h"
#include "cuda/device/row_wait.cuh"

namespace mok::cuda {

template <class T>
ffi::Error Forward(cudaStream_t stream, ffi::ScratchAllocator& scratch, const DeviceInfo& dev,
                   const Problem& pr, const T* x, const int* ids, const float* w, const T* wgu,
                   const T* wd, T* y, T* h_save, const RowWait* wait) {
  const int64_t TK = pr.assignments(), H = pr.hidden, F = pr.ffn;
  const bool wgmma = UseWgmma(pr.dtype);
  const bool pregather = wgmma && UsePregatherX(F, TK / pr.experts);  // moe.cuh: long GEMMs
  T* x_sorted = nullptr;  // [P, H] x[sorted_token] (pregather only)
  auto layout = [&](Carve& c, Routing* r, T** act, T** y_part) {
    *r = CarveRouting(c, pr, ids);
    *act = c.take<T>(TK * F);     // [P, F]
    *y_part = c.take<T>(TK * H);  // [P, H] w · (a @ Wd[e]) per assignment
    x_sorted = pregather ? c.take<T>(TK * H) : nullptr;
  };
  Carve probe;
  Routing r;
  T* act;
  T* y_part;
  layout(probe, &r, &act, &y_part);
  char* base;
  MOK_RETURN_IF_ERROR(AllocateScratch(scratch, probe.used, &base));
  Carve c{base};
  layout(c, &r, &act, &y_part);

  const int bn = wgmma ? kWgmmaBN : kSimtBN;
  ProfileStart(stream);
  MOK_RETURN_IF_ERROR(Stage("routing", build_routing(r, stream), stream));
  // Overlapped fused forward: the wgmma gate/up GEMM gathers x row by row and waits per tile;
  // the pregather and the SIMT GEMM read every row at once, so they wait for all of them first.
  const bool tile_wait = wait && wgmma && !pregather;
  if (wait && !tile_wait) {
    wait_rows_kernel<<<1, 32, 0, stream>>>(*wait);
    MOK_RETURN_IF_ERROR(Stage("wait for the peers' rows", cudaGetLastError(), stream));
  }
  if (pregather)
    MOK_RETURN_IF_ERROR(
        Stage("gather x into expert order",
              launch_gather<T>(x, r.sorted_token, r.expert_offset, static_cast<int>(pr.experts),
                               x_sorted, static_cast<int>(H), dev.sms, stream),
              stream));

  GemmParams g1 = RoutedParams(r, w);  // h = x[tok] @ Wgu[e] → a = silu(h_g) h_u
  g1.N = F, g1.K = H, g1.glu = true, g1.glu_offset = F, g1.n_tiles = CeilDiv(F, bn / 2);
  const ExpertOrderRows x_rows = InExpertOrder(x, x_sorted, r);
  g1.a = x_rows.base, g1.a_gather = x_rows.gather, g1.lda = H, g1.a_rows = TK;
  if (tile_wait) g1.wait = *wait;
  g1.b = wgu, g1.b_expert_stride = H * 2 * F, g1.ldb = 2 * F;
  g1.out = act, g1.ldo = F, g1.out2 = h_save;
  if (h_save) {  // training: keep h for the backward (saves its recompute GEMM)
    MOK_RETURN_IF_ERROR(Stage(
        "gate/up GEMM + SwiGLU (h saved)",
        LaunchGemm<T, Mode::kRoutedBN, Epi::kSwiGLUSave>(g1, wgmma, dev.sms, stream), stream));
  } else {
    MOK_RETURN_IF_ERROR(
        Stage("gate/up GEMM + SwiGLU",
              LaunchGemm<T, Mode::kRoutedBN, Epi::kSwiGLU>(g1, wgmma, dev.sms, stream), stream));
  }

  GemmParams g2 = RoutedParams(r, w);  // y_part = w · (a @ Wd[e])
  g2.N = H, g2.K = F, g2.n_tiles = CeilDiv(H, bn);
  g2.a = act, g2.lda = F, g2.a_rows = TK;
  g2.b = wd, g2.b_expert_stride = F * H, g2.ldb = H;
  g2.out = y_part, g2.ldo = H;
  MOK_RETURN_IF_ERROR(
      Stage("down GEMM x weight",
            LaunchGemm<T, Mode::kRoutedBN, Epi::kWeighted>(g2, wgmma, dev.sms, stream), stream));

  MOK_RETURN_IF_ERROR(
      Stage("combine y",
            launch_combine<T>(y_part, r.assign_pos, y, static_cast<int>(pr.tokens),
                              static_cast<int>(pr.top_k), static_cast<int>(H), dev.sms, stream),
            stream));
  return ffi::Error::Success();
}

template ffi::Error Forward<bf16>(cudaStream_t stream, ffi::ScratchAllocator& scratch,
                                  const DeviceInfo& dev, const Problem& pr, const bf16* x,
                                  const int* ids, const float* w, const bf16* wgu, const bf16* wd,
                                  bf16* y, bf16* h_save, const RowWait* wait);
template ffi::Error Forward<float>(cudaStream_t stream, ffi::ScratchAllocator& scratch,
                                   const DeviceInfo& dev, const Problem& pr, const float* x,
                                   const int* ids, const float* w, const float* wgu,
                                   const float* wd, float* y, float* h_save, const RowWait* wait);

}  // namespace mok::cuda
