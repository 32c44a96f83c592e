// The phases of one call, in order, on XLA's stream (no host sync):
//   forward : route → gate/up GEMM (+SwiGLU) → down GEMM (× routing weight) → combine over k
//   backward: route → gate/up GEMM (h) → dy·Wd^T GEMM (+SwiGLU bwd, d_w partials) → dh·Wgu^T GEMM
//             → combine dx, reduce d_w → weight-gradient GEMMs (K = the expert's tokens)
// Scratch comes from XLA's FFI ScratchAllocator, carved into the buffers below.
#pragma once

#include <cstdlib>
#include <cstring>

#include "common/problem.h"
#include "cuda/combine.cuh"
#include "cuda/simt.cuh"
#include "cuda/status.cuh"
#ifdef JAX_MOK_HAVE_CUTLASS
#include "cuda/mainloop.cuh"
#include "cuda/tma.h"
#endif

namespace mok::cuda {

inline bool UseWgmma(ffi::DataType dtype) {
#ifdef JAX_MOK_HAVE_CUTLASS
  if (dtype != ffi::DataType::BF16) return false;
  const char* env = std::getenv("JAX_MOK_CUDA_GEMM");
  return !(env && std::strcmp(env, "simt") == 0);
#else
  (void)dtype;
  return false;
#endif
}

// Routed-M GEMMs load the weight tile by TMA (default; measured 2026-11-29: bitwise equal to the
// cp.async path, 26-37 % faster forward). JAX_MOK_CUDA_TMA=0 selects cp.async for every operand;
// a failed tensor-map encode also falls back to cp.async.
inline bool UseTma() {
  const char* env = std::getenv("JAX_MOK_CUDA_TMA");
  return !(env && env[0] == '0');
}

// JAX_MOK_CUDA_TMA_A=1 (experimental, not yet run on a GPU): a non-gathered A (the forward's
// activations, the backward's dh) also comes by TMA, one thread driving the whole ring.
inline bool UseTmaA() {
  const char* env = std::getenv("JAX_MOK_CUDA_TMA_A");
  return env && env[0] == '1';
}

template <class T, Mode kMode, Epi kEpi>
cudaError_t LaunchGemm(const GemmParams& p, bool wgmma, int sms, cudaStream_t stream) {
#ifdef JAX_MOK_HAVE_CUTLASS
  if constexpr (std::is_same_v<T, bf16>) {
    if constexpr (kMode != Mode::kRoutedK) {
      if (wgmma && UseTma()) {
        GemmParams with_map = p;
        if (MakeWeightTensorMap(with_map, kMode)) {
          if constexpr (kEpi == Epi::kWeighted || kEpi == Epi::kStoreF32) {
            if (UseTmaA() && MakeActivationTensorMap(with_map))
              return launch_wgmma_gemm<kMode, kEpi, true, true>(with_map, sms, stream);
          }
          return launch_wgmma_gemm<kMode, kEpi, true>(with_map, sms, stream);
        }
      }
    }
    if (wgmma) return launch_wgmma_gemm<kMode, kEpi>(p, sms, stream);
  }
#endif
  (void)wgmma;
  return launch_simt_gemm<T, kMode, kEpi>(p, sms, stream);
}

// Bump allocator over one scratch allocation.
struct Carve {
  char* base = nullptr;
  size_t used = 0;
  template <class U>
  U* take(int64_t count) {
    U* out = reinterpret_cast<U*>(base + used);
    used += (sizeof(U) * static_cast<size_t>(count) + 255) & ~size_t{255};
    return out;
  }
};

// XLA's FFI scratch allocator accepts alignments up to 16 bytes: over-allocate and align to 256.
inline ffi::Error AllocateScratch(ffi::ScratchAllocator& scratch, size_t bytes, char** base) {
  auto mem = scratch.Allocate(bytes + 256, 16);
  MOK_CUDA_CHECK(mem.has_value(), "could not allocate ", bytes, " bytes of device scratch");
  const uintptr_t p = reinterpret_cast<uintptr_t>(*mem);
  *base = reinterpret_cast<char*>((p + 255) & ~uintptr_t{255});
  return ffi::Error::Success();
}

inline int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Sizes the routing part of the scratch (pass base = nullptr to measure).
inline Routing CarveRouting(Carve& c, const Problem& pr, const int* topk_ids) {
  Routing r{};
  r.topk_ids = topk_ids;
  r.assignments = static_cast<int>(pr.assignments());
  r.experts = static_cast<int>(pr.experts);
  r.top_k = static_cast<int>(pr.top_k);
  r.chunks = CeilDiv(r.assignments, kRouteChunk);
  r.chunk_counts = c.take<int>(static_cast<int64_t>(r.chunks) * r.experts);
  r.expert_offset = c.take<int>(r.experts + 1);
  r.mtile_prefix = c.take<int>(r.experts + 1);
  r.sorted_token = c.take<int>(r.assignments);
  r.sorted_slot = c.take<int>(r.assignments);
  r.assign_pos = c.take<int>(r.assignments);
  return r;
}

inline GemmParams RoutedParams(const Routing& r, const float* topk_weights) {
  GemmParams p{};
  p.expert_offset = r.expert_offset;
  p.mtile_prefix = r.mtile_prefix;
  p.sorted_token = r.sorted_token;
  p.sorted_slot = r.sorted_slot;
  p.experts = r.experts;
  p.topk_weights = topk_weights;
  return p;
}

template <class T>
ffi::Error Forward(cudaStream_t stream, ffi::ScratchAllocator& scratch, const DeviceInfo& dev,
                   const Problem& pr, const T* x, const int* ids, const float* w, const T* wgu,
                   const T* wd, T* y) {
  const int64_t TK = pr.assignments(), H = pr.hidden, F = pr.ffn;
  auto layout = [&](Carve& c, Routing* r, T** act, float** y_part) {
    *r = CarveRouting(c, pr, ids);
    *act = c.take<T>(TK * F);         // [P, F]
    *y_part = c.take<float>(TK * H);  // [P, H]
  };
  Carve probe;
  Routing r;
  T* act;
  float* y_part;
  layout(probe, &r, &act, &y_part);
  char* base;
  MOK_RETURN_IF_ERROR(AllocateScratch(scratch, probe.used, &base));
  Carve c{base};
  layout(c, &r, &act, &y_part);

  const bool wgmma = UseWgmma(pr.dtype);
  const int bn = wgmma ? kWgmmaBN : kSimtBN;
  MOK_RETURN_IF_ERROR(Stage("routing", build_routing(r, stream), stream));

  GemmParams g1 = RoutedParams(r, w);  // h = x[tok] @ Wgu[e] → a = silu(h_g) h_u
  g1.N = F, g1.K = H, g1.glu = true, g1.glu_offset = F, g1.n_tiles = CeilDiv(F, bn / 2);
  g1.a = x, g1.lda = H, g1.a_gather = r.sorted_token;
  g1.b = wgu, g1.b_expert_stride = H * 2 * F, g1.ldb = 2 * F;
  g1.out = act, g1.ldo = F;
  MOK_RETURN_IF_ERROR(
      Stage("gate/up GEMM + SwiGLU",
            LaunchGemm<T, Mode::kRoutedBN, Epi::kSwiGLU>(g1, wgmma, dev.sms, stream), stream));

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

template <class T>
ffi::Error Backward(cudaStream_t stream, ffi::ScratchAllocator& scratch, const DeviceInfo& dev,
                    const Problem& pr, const T* dy, const T* x, const int* ids, const float* w,
                    const T* wgu, const T* wd, T* dx, float* d_w, T* d_wgu, T* d_wd) {
  const int64_t TK = pr.assignments(), H = pr.hidden, F = pr.ffn;
  const bool wgmma = UseWgmma(pr.dtype);
  const int bn = wgmma ? kWgmmaBN : kSimtBN;
  const int g_tiles = CeilDiv(F, bn);
  struct Buffers {
    Routing r;
    float* h;        // [P, 2F] recomputed gate/up pre-activations
    T* dh;           // [P, 2F]
    T* aw;           // [P, F]  w · a
    float* dx_part;  // [P, H]
    float* dw_part;  // [P, g_tiles]
  } b;
  auto layout = [&](Carve& c) {
    b.r = CarveRouting(c, pr, ids);
    b.h = c.take<float>(TK * 2 * F);
    b.dh = c.take<T>(TK * 2 * F);
    b.aw = c.take<T>(TK * F);
    b.dx_part = c.take<float>(TK * H);
    b.dw_part = c.take<float>(TK * g_tiles);
  };
  Carve probe;
  layout(probe);
  char* base;
  MOK_RETURN_IF_ERROR(AllocateScratch(scratch, probe.used, &base));
  Carve c{base};
  layout(c);
  const Routing& r = b.r;
  MOK_RETURN_IF_ERROR(Stage("routing", build_routing(r, stream), stream));

  GemmParams g1 = RoutedParams(r, w);  // h = x[tok] @ Wgu[e]  (stored f32)
  g1.N = F, g1.K = H, g1.glu = true, g1.glu_offset = F, g1.n_tiles = CeilDiv(F, bn / 2);
  g1.a = x, g1.lda = H, g1.a_gather = r.sorted_token;
  g1.b = wgu, g1.b_expert_stride = H * 2 * F, g1.ldb = 2 * F;
  g1.out = b.h, g1.ldo = 2 * F;
  MOK_RETURN_IF_ERROR(
      Stage("gate/up GEMM (recompute)",
            LaunchGemm<T, Mode::kRoutedBN, Epi::kStoreGLU>(g1, wgmma, dev.sms, stream), stream));

  GemmParams g2 = RoutedParams(r, w);  // g = dy[tok] @ Wd[e]^T → dh, w·a, d_w partials
  g2.N = F, g2.K = H, g2.n_tiles = g_tiles;
  g2.a = dy, g2.lda = H, g2.a_gather = r.sorted_token;
  g2.b = wd, g2.b_expert_stride = F * H, g2.ldb = H;
  g2.out = b.dh, g2.out2 = b.aw, g2.h = b.h, g2.dw_part = b.dw_part, g2.ldo = 2 * F;
  MOK_RETURN_IF_ERROR(
      Stage("dy Wd^T GEMM + SwiGLU bwd",
            LaunchGemm<T, Mode::kRoutedBK, Epi::kSwiGLUBwd>(g2, wgmma, dev.sms, stream), stream));

  GemmParams g3 = RoutedParams(r, w);  // dx_part = dh @ Wgu[e]^T
  g3.N = H, g3.K = 2 * F, g3.n_tiles = CeilDiv(H, bn);
  g3.a = b.dh, g3.lda = 2 * F, g3.a_rows = TK;
  g3.b = wgu, g3.b_expert_stride = H * 2 * F, g3.ldb = 2 * F;
  g3.out = b.dx_part, g3.ldo = H;
  MOK_RETURN_IF_ERROR(
      Stage("dh Wgu^T GEMM",
            LaunchGemm<T, Mode::kRoutedBK, Epi::kStoreF32>(g3, wgmma, dev.sms, stream), stream));

  MOK_RETURN_IF_ERROR(
      Stage("combine dx",
            launch_combine<T>(b.dx_part, r.assign_pos, dx, static_cast<int>(pr.tokens),
                              static_cast<int>(pr.top_k), static_cast<int>(H), dev.sms, stream),
            stream));
  reduce_dw_kernel<<<CeilDiv(TK, 256), 256, 0, stream>>>(b.dw_part, r.assign_pos, d_w,
                                                         static_cast<int>(TK), g_tiles);
  MOK_RETURN_IF_ERROR(Stage("reduce d_w", cudaGetLastError(), stream));

  GemmParams g4 = RoutedParams(r, w);  // dWd[e] = (w·a)^T dy[tok]    [F, H]
  g4.M = F, g4.N = H, g4.m_tiles = CeilDiv(F, kTileM), g4.n_tiles = CeilDiv(H, bn);
  g4.a = b.aw, g4.lda = F;
  g4.b = dy, g4.ldb = H, g4.b_gather = r.sorted_token;
  g4.out = d_wd, g4.ldo = H;
  MOK_RETURN_IF_ERROR(
      Stage("dWd GEMM", LaunchGemm<T, Mode::kRoutedK, Epi::kStoreCast>(g4, wgmma, dev.sms, stream),
            stream));

  GemmParams g5 = RoutedParams(r, w);  // dWgu[e] = x[tok]^T dh          [H, 2F]
  g5.M = H, g5.N = 2 * F, g5.m_tiles = CeilDiv(H, kTileM), g5.n_tiles = CeilDiv(2 * F, bn);
  g5.a = x, g5.lda = H, g5.a_gather = r.sorted_token;
  g5.b = b.dh, g5.ldb = 2 * F;
  g5.out = d_wgu, g5.ldo = 2 * F;
  MOK_RETURN_IF_ERROR(
      Stage("dWgu GEMM", LaunchGemm<T, Mode::kRoutedK, Epi::kStoreCast>(g5, wgmma, dev.sms, stream),
            stream));
  return ffi::Error::Success();
}

}  // namespace mok::cuda
