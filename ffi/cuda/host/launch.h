// The phases of one call, in order, on XLA's stream (no host sync):
//   forward : route → gate/up GEMM (+SwiGLU) → down GEMM (× routing weight) → combine over k
//   backward: route → gate/up GEMM (h) → dy·Wd^T GEMM (+SwiGLU bwd, d_w partials) → dh·Wgu^T GEMM
//             → combine dx, reduce d_w → weight-gradient GEMMs (K = the expert's tokens)
// Scratch comes from XLA's FFI ScratchAllocator, carved into the buffers below.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/problem.h"
#include "cuda/device/combine.cuh"
#include "cuda/phases/phases.h"
#include "cuda/device/simt.cuh"
#include "cuda/host/stage.h"
#ifdef JAX_MOK_HAVE_CUTLASS
#include "cuda/device/mainloop_sm90.cuh"
#include "cuda/host/tma.h"
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

// A non-gathered A operand (the forward's activations, the backward's dh) comes by TMA as well,
// one thread driving the ring (default; measured 2026-11-29 on all six shapes: bitwise equal to
// the cp.async A path, forward 0-4 % faster). JAX_MOK_CUDA_TMA_A=0 selects cp.async for A.
inline bool UseTmaA() {
  const char* env = std::getenv("JAX_MOK_CUDA_TMA_A");
  return !(env && env[0] == '0');
}

// The weight-gradient (routed-K) GEMMs read x and dy gathered once into expert order, so that
// both their operands come by TMA (default; needs JAX_MOK_CUDA_TMA on). JAX_MOK_CUDA_TMA_WGRAD=0
// keeps the row-by-row cp.async gathers of both operands.
inline bool UseTmaWgrad() {
  const char* env = std::getenv("JAX_MOK_CUDA_TMA_WGRAD");
  return UseTma() && !(env && env[0] == '0');
}

// Forward: gather x once into expert order so that the gate/up GEMM takes A by TMA as well (the
// backward does this for its weight gradients). Costs T·k·H elements of scratch and one gather
// pass, so it pays where the gate/up GEMM is long per row, i.e. for a large FFN width. Measured on
// an H200 (2026-11-29, docs/perf-notes.md), gate/up GEMM + gather against the row gather: S3
// (F = 14336) 13.6 → 11.9 ms, S6 (2048) 0.65 → 0.62, S2 (2048) 7.70 → 7.68, S4 (3072) 9.44 →
// 10.04, S1 (768) 3.25 → 3.53. Default: on for F ≥ 4096, and for F ≥ 2048 with at least 512
// rows per expert on average (S6 gate/up 0.647 → 0.554 ms plus a 0.057-ms gather, one run;
// S4's 112 rows lost: the gather does not pay for short experts);
// JAX_MOK_CUDA_PREGATHER_X=1 / =0 forces it.
inline bool UsePregatherX(int64_t ffn, int64_t rows_per_expert) {
  const char* env = std::getenv("JAX_MOK_CUDA_PREGATHER_X");
  const bool want =
      (env && env[0]) ? env[0] == '1' : ffn >= 4096 || (ffn >= 2048 && rows_per_expert >= 512);
  return UseTma() && UseTmaA() && want;
}

// Plain row outputs (weight gradients, the down GEMM's weighted rows, dx rows) stored through
// shared memory in 16-byte coalesced chunks (mainloop.cuh: store_rows_staged) instead of 4-byte
// pair stores, where the extra 16 KB of shared memory fits (not for E near the 4096 limit: then
// the plain stores). Default on: bitwise equal to the pair stores, and measured on an H200
// (2026-11-29): S1's down GEMM 3.64 → 1.36 ms, S4's dWd + dWgu 53.3 → 26.9 ms, S5's 22.5 → 9.7 ms.
// JAX_MOK_CUDA_STAGED_STORES=0 keeps the pair stores.
inline bool UseStagedStores(size_t smem_needed) {
  const char* env = std::getenv("JAX_MOK_CUDA_STAGED_STORES");
  if (env && env[0] == '0') return false;
  // The opt-in limit per device, queried once (every GEMM launch asks).
  static std::atomic<int> limits[64];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  int limit = limits[device].load(std::memory_order_relaxed);
  if (limit == 0) {
    if (cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
        cudaSuccess)
      return false;
    limits[device].store(limit, std::memory_order_relaxed);
  }
  return smem_needed <= static_cast<size_t>(limit);
}

// The forward's SwiGLU epilogues (activations, and h when saved) through shared memory as well
// (mainloop.cuh: store_glu_staged). Experimental, default off: bitwise equal on an H200
// (2026-11-30), timed only together with two other switches that lost (its own effect is
// unknown); JAX_MOK_CUDA_STAGED_GLU=1 turns it on where the staging area fits. Aimed at the
// gate/up GEMMs with short K (S1, S6: K = 2048), whose 4-byte pair stores of a (and of h in
// training) resemble the down GEMM's before the staged row stores (S1: 3.64 → 1.36 ms).
inline bool UseStagedGlu(size_t smem_needed) {
  const char* env = std::getenv("JAX_MOK_CUDA_STAGED_GLU");
  return env && env[0] == '1' && UseStagedStores(smem_needed);
}

// Whether the wgmma kernel for epilogue kEpi (A by TMA or not) stores its output through the
// shared-memory staging area: the plain row outputs (UseStagedStores; with A by TMA: the down
// GEMM, dh·Wguᵀ, the weight gradients) and the forward's SwiGLU outputs (UseStagedGlu).
template <Epi kEpi, bool kTmaA>
constexpr bool kCanStage =
    ((kEpi == Epi::kWeighted || kEpi == Epi::kStoreRows || kEpi == Epi::kStoreCast) && kTmaA) ||
    kEpi == Epi::kSwiGLU || kEpi == Epi::kSwiGLUSave;

template <Mode kMode, Epi kEpi, bool kTmaA>
bool StagedOut(const GemmParams& p) {
  const size_t smem = wgmma_smem_bytes<kMode, true, kTmaA, true>(p.experts);
  if constexpr (kEpi == Epi::kSwiGLU || kEpi == Epi::kSwiGLUSave)
    return UseStagedGlu(smem);
  else
    return UseStagedStores(smem);
}

// The wgmma kernel with TMA weights (and A by TMA when kTmaA), its output staged where StagedOut.
template <Mode kMode, Epi kEpi, bool kTmaA>
cudaError_t LaunchTma(const GemmParams& p, int sms, cudaStream_t stream) {
  if constexpr (kCanStage<kEpi, kTmaA>) {
    if (StagedOut<kMode, kEpi, kTmaA>(p))
      return launch_wgmma_gemm<kMode, kEpi, true, kTmaA, true>(p, sms, stream);
  }
  return launch_wgmma_gemm<kMode, kEpi, true, kTmaA>(p, sms, stream);
}

template <class T, Mode kMode, Epi kEpi>
cudaError_t LaunchGemm(const GemmParams& p, bool wgmma, int sms, cudaStream_t stream) {
#ifdef JAX_MOK_HAVE_CUTLASS
  if constexpr (std::is_same_v<T, bf16>) {
    if constexpr (kMode == Mode::kRoutedK) {
      if (wgmma && p.a_gather == nullptr && p.b_gather == nullptr) {
        GemmParams with_maps = p;
        if (MakeWgradTensorMaps(with_maps))
          return LaunchTma<kMode, kEpi, true>(with_maps, sms, stream);
      }
    } else {
      if (wgmma && UseTma()) {
        GemmParams with_map = p;
        if (MakeWeightTensorMap(with_map, kMode)) {
          // (A is gathered in the default forward: MakeActivationTensorMap declines it)
          if constexpr (kEpi == Epi::kWeighted || kEpi == Epi::kStoreRows ||
                        kEpi == Epi::kSwiGLUBwd || kEpi == Epi::kSwiGLU ||
                        kEpi == Epi::kSwiGLUSave) {
            if (UseTmaA() && MakeActivationTensorMap(with_map))
              return LaunchTma<kMode, kEpi, true>(with_map, sms, stream);
          }
          return LaunchTma<kMode, kEpi, false>(with_map, sms, stream);
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

// Rows of a token matrix in expert order (position p holds token sorted_token[p]): read through
// the gather, or from a copy made once in that order (`sorted`, nullptr when there is none),
// which the GEMMs then load by TMA where they can (UseTmaWgrad, UsePregatherX).
struct ExpertOrderRows {
  const void* base;
  const int* gather;
};
template <class T>
ExpertOrderRows InExpertOrder(const T* tokens, const T* sorted, const Routing& r) {
  return sorted ? ExpertOrderRows{sorted, nullptr} : ExpertOrderRows{tokens, r.sorted_token};
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

}  // namespace mok::cuda
