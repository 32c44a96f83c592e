// How the phases launch their kernels: the grouped GEMM for a Plan (the SIMT or the wgmma kernels;
// for wgmma the tensor maps and the staged-store variant), scratch carving and the routing
// scratch. Every function returns an ffi::Error naming the phase that failed.
#pragma once

#include <type_traits>
#include <utility>

#include "common/problem.h"
#include "cuda/device/combine.cuh"
#include "cuda/device/simt.cuh"
#include "cuda/host/plan.h"
#include "cuda/host/stage.h"
#include "cuda/host/tma.h"
#include "cuda/phases/phases.h"
#ifdef JAX_MOK_HAVE_CUTLASS
#include "cuda/device/mainloop_sm90.cuh"
#endif

namespace mok::cuda {

// Bump allocator over one scratch allocation (base = nullptr: measures).
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

// One scratch allocation for a call's buffers: `layout(Carve&)` takes them in order, once to
// measure (base = nullptr) and once over the allocation, so that both passes agree.
template <class Layout>
ffi::Error CarveScratch(ffi::ScratchAllocator& scratch, Layout&& layout) {
  Carve probe;
  layout(probe);
  char* base;
  MOK_RETURN_IF_ERROR(AllocateScratch(scratch, probe.used, &base));
  Carve c{base};
  layout(c);
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
  r.chunk_counts = c.take<int>(static_cast<int64_t>(r.chunks) * r.experts + kTileCounters);
  r.tile_counters = r.chunk_counts + static_cast<int64_t>(r.chunks) * r.experts;
  r.expert_offset = c.take<int>(r.experts + 1);
  r.mtile_prefix = c.take<int>(r.experts + 1);
  r.sorted_token = c.take<int>(r.assignments);
  r.sorted_slot = c.take<int>(r.assignments);
  r.assign_pos = c.take<int>(r.assignments);
  return r;
}

// Rows of a token matrix in expert order (position p holds token sorted_token[p]): read through
// the gather, or from a copy made once in that order (`sorted`, nullptr when there is none),
// which the wgmma GEMMs then load by TMA.
struct ExpertOrderRows {
  const void* base;
  const int* gather;
};
template <class T>
ExpertOrderRows InExpertOrder(const T* tokens, const T* sorted, const Routing& r) {
  return sorted ? ExpertOrderRows{sorted, nullptr} : ExpertOrderRows{tokens, r.sorted_token};
}

// x and dy copied once into expert order (Plan::pregather_x in a backward: the weight-gradient
// GEMMs then load both operands by TMA, and dy·Wd^T its A), as one phase.
template <class T>
ffi::Error GatherXDy(const Routing& r, const T* x, const T* dy, int64_t hidden, T* x_sorted,
                     T* dy_sorted, int sms, cudaStream_t stream) {
  return Stage("gather x, dy into expert order",
               launch_to_expert_order<T>(r, x, x_sorted, dy, dy_sorted, static_cast<int>(hidden),
                                         sms, stream),
               stream);
}

// The weight gradients by the routed-K GEMMs in T (phases/backward.cu), from the backward's
// expert-ordered operands: dWd[e] = (w·a)^T dy[tok] [F, H], dWgu[e] = x[tok]^T dh [H, 2F]. Also
// the FP8 backward's, with MoEConfig.fp8_weight_gradients = "unquantized".
template <class T>
ffi::Error WeightGradients(cudaStream_t stream, const Plan& plan, const Routing& r,
                           const float* topk_weights, int64_t assignments, int64_t hidden,
                           int64_t ffn, ExpertOrderRows x_rows, ExpertOrderRows dy_rows,
                           const T* aw, const T* dh, T* d_wgu, T* d_wd);

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

// A routed-M GEMM's parameters: RoutedParams with the call's tile counter `counter` (<
// kTileCounters; each routed-M GEMM of a forward or backward call its own), which hands the
// tiles out in order (GemmParams::tile_counter). Routed-K GEMMs keep RoutedParams' null counter.
inline GemmParams RoutedMParams(const Routing& r, const float* topk_weights, int counter) {
  GemmParams p = RoutedParams(r, topk_weights);
  p.tile_counter = r.tile_counters + counter;
  return p;
}

#ifdef JAX_MOK_HAVE_CUTLASS
// The wgmma kernel, staged where the plan says and the kernel can (plain row outputs).
template <Mode kMode, Epi kEpi, bool kTmaA>
cudaError_t LaunchWgmma(const GemmParams& p, const Plan& plan, cudaStream_t stream) {
  // (Routed-M kernels with a gathered A have SwiGLU epilogues, never a staged one.)
  if constexpr (kStagedEpilogue<kEpi>) {
    if (plan.staged_stores) return launch_wgmma_gemm<kMode, kEpi, kTmaA, true>(p, plan.sms, stream);
  }
  return launch_wgmma_gemm<kMode, kEpi, kTmaA, false>(p, plan.sms, stream);
}

// The routed-M wgmma GEMM. How A arrives depends on the epilogue:
//   kSwiGLU, kSwiGLUSave and their Mx kinds (forward gate/up), kSwiGLUBwd (dy·Wd^T): by TMA when
//     x / dy was copied into expert order (Plan::pregather_x), else gathered row by row by
//     cp.async;
//   kStoreGLU (the backward's recompute of h): by cp.async (its TMA-A variant has not run on a
//   GPU); kWeighted, kStoreRows: by TMA (their A is never gathered on the wgmma path).
template <Mode kMode, Epi kEpi>
cudaError_t LaunchRoutedM(GemmParams& p, const GemmNames& names, const Plan& plan,
                          cudaStream_t stream, ffi::Error* error) {
  *error = MakeWeightTensorMap(p, kMode, names);
  if (error->failure()) return cudaSuccess;
  if constexpr (kEpi == Epi::kStoreGLU) {
    return LaunchWgmma<kMode, kEpi, false>(p, plan, stream);
  } else {
    if constexpr (kEpi == Epi::kSwiGLU || kEpi == Epi::kSwiGLUSave || kEpi == Epi::kSwiGLUBwd ||
                  IsMxGlu(kEpi)) {
      if (p.a_gather != nullptr) return LaunchWgmma<kMode, kEpi, false>(p, plan, stream);
    }
    *error = MakeActivationTensorMap(p, names);
    if (error->failure()) return cudaSuccess;
    if constexpr (kStagedEpilogue<kEpi>) {
      if (plan.staged_stores) *error = MakeOutputTensorMap(p, kMode, names);
      if (error->failure()) return cudaSuccess;
    }
    return LaunchWgmma<kMode, kEpi, true>(p, plan, stream);
  }
}
#endif

// One grouped GEMM of a phase: the wgmma kernel when the plan says so (bf16 only), else the SIMT
// kernel; its launch status checked as the phase `names.phase`.
template <class T, Mode kMode, Epi kEpi>
ffi::Error RunGemm(const GemmNames& names, GemmParams p, const Plan& plan, cudaStream_t stream) {
#ifdef JAX_MOK_HAVE_CUTLASS
  if constexpr (std::is_same_v<T, bf16>) {
    if (plan.wgmma) {
      if constexpr (kMode == Mode::kRoutedK) {
        MOK_RETURN_IF_ERROR(MakeWgradTensorMaps(p, names));
        if (kStagedEpilogue<kEpi> && plan.staged_stores)
          MOK_RETURN_IF_ERROR(MakeOutputTensorMap(p, kMode, names));
        const bool gathered = p.a_gather != nullptr || p.b_gather != nullptr;
        return Stage(names.phase,
                     gathered ? LaunchWgmma<kMode, kEpi, false>(p, plan, stream)
                              : LaunchWgmma<kMode, kEpi, true>(p, plan, stream),
                     stream);
      } else {
        ffi::Error error = ffi::Error::Success();
        const cudaError_t launched = LaunchRoutedM<kMode, kEpi>(p, names, plan, stream, &error);
        MOK_RETURN_IF_ERROR(std::move(error));
        return Stage(names.phase, launched, stream);
      }
    }
  }
#endif
  if constexpr (IsMxGlu(kEpi)) {  // the mx epilogues exist on the bf16 wgmma path only
    return ffi::Error::InvalidArgument(std::string("jax_mok: ") + names.phase +
                                       " needs the bf16 wgmma kernels (sm_90a, bf16 x)");
  } else {
    return Stage(names.phase, launch_simt_gemm<T, kMode, kEpi>(p, plan.sms, stream), stream);
  }
}

// The backward's reductions after the dx GEMM: dx[t] = the k rows of dx_part of token t summed in
// slot order, and d_w[t, j] = the n-tile partials of assignment (t, j) summed (0 where skipped).
template <class T>
ffi::Error CombineGradients(const Routing& r, const Problem& pr, const T* dx_part, T* dx,
                            const float* dw_part, float* d_w, int n_tiles, int sms,
                            cudaStream_t stream) {
  MOK_RETURN_IF_ERROR(
      Stage("combine dx",
            launch_combine<T>(dx_part, r.assign_pos, dx, static_cast<int>(pr.tokens),
                              static_cast<int>(pr.top_k), static_cast<int>(pr.hidden), sms, stream),
            stream));
  const int64_t assignments = pr.assignments();
  reduce_dw_kernel<<<CeilDiv(assignments, 256), 256, 0, stream>>>(
      dw_part, r.assign_pos, d_w, static_cast<int>(assignments), n_tiles);
  return Stage("reduce d_w", cudaGetLastError(), stream);
}

}  // namespace mok::cuda
