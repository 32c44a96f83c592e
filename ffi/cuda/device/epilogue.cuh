// Epilogues, shared by the SIMT and wgmma mainloops. A consumer thread holds BN/2 f32 values of
// a 64 × BN warpgroup tile in the wgmma accumulator layout (ptx.cuh: frag_row / frag_col);
// pairs (i, i+1) are adjacent columns of one row, so every store writes two elements.
#pragma once

#include "cuda/device/gemm_params.cuh"

namespace mok::cuda {

// SwiGLU forward of one element: silu(gate) * up. Every epilogue that writes `a` (BF16 and FP8,
// registers or staged) calls this, so that their outputs agree bit for bit.
__device__ __forceinline__ float silu_mul(float gate, float up) {
  return gate * sigmoidf(gate) * up;
}

// SwiGLU backward of one element, from g = (dy @ Wd^T)[p, f], h = (gate, up) and the routing
// weight wt of row p:
//   a = silu(hg) hu,  d_a = wt g,  dh_gate = d_a hu silu'(hg),  dh_up = d_a silu(hg),  aw = wt a.
// d_w of the row sums g * a. Shared by run_epilogue and the staged epilogue (bitwise equal).
struct SwiGLUGrad {
  float dgate, dup, aw, a;
};
__device__ __forceinline__ SwiGLUGrad swiglu_bwd(float g, float hg, float hu, float wt) {
  const float s = sigmoidf(hg);
  const float silu = hg * s;
  const float a = silu * hu;
  const float da = wt * g;
  return {da * hu * s * (1.f + hg * (1.f - s)), da * silu, wt * a, a};
}

// The two rows a consumer thread holds in its warpgroup's 64 (frag_row(0, t), frag_row(2, t)):
// whether each lies in the tile, its position, and (`weights`) its routing weight, loaded once: a
// load placed between the epilogue's stores would wait for them (they may alias it as far as the
// compiler knows).
struct FragRows {
  bool ok[2];
  int64_t pos[2];
  float weight[2];
  __device__ __forceinline__ FragRows(const GemmParams& p, const WorkTile& w, int wg, int t,
                                      bool weights) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 64 * wg + frag_row(2 * h, t);
      ok[h] = r < w.rows;
      pos[h] = w.row0 + r;
      weight[h] = !weights ? 1.f : ok[h] ? p.topk_weights[p.sorted_slot[pos[h]]] : 0.f;
    }
  }
};

// kSwiGLUBwd's d_w partials: each row's sum over the 4 lanes that share it, in a fixed order,
// then one partial per row and tile.
__device__ __forceinline__ void store_dw_partials(const GemmParams& p, const WorkTile& w,
                                                  const FragRows& rows, const float* dw, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float s = dw[h];
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    if ((t & 3) == 0 && rows.ok[h]) p.dw_part[rows.pos[h] * p.n_tiles + w.n_tile] = s;
  }
}

template <class T, Epi kEpi, int BN, class Acc>
__device__ __forceinline__ void run_epilogue(const GemmParams& p, const WorkTile& w, Acc&& acc,
                                             int wg, int t) {
  constexpr int kValues = BN / 2;
  const int row_base = 64 * wg;

  if constexpr (kEpi == Epi::kSwiGLU || kEpi == Epi::kStoreGLU || kEpi == Epi::kSwiGLUSave) {
    // Gate value i pairs with up value i + BN/4 (column + BN/2), held by the same thread.
    // h rows are [gate | up], 2F wide, in x's dtype (what the backward's SwiGLU reads).
    constexpr int kUp = BN / 4;
    const int F = p.N;
#pragma unroll
    for (int i = 0; i < kUp; i += 2) {
      const int r = row_base + frag_row(i, t);
      const int f = w.n_tile * (BN / 2) + frag_col(i, t);
      if (r >= w.rows || f >= F) continue;
      const int64_t pos = w.row0 + r;
      const float g0 = acc(i), g1 = acc(i + 1), u0 = acc(i + kUp), u1 = acc(i + kUp + 1);
      if constexpr (kEpi != Epi::kStoreGLU)
        store2(static_cast<T*>(p.out) + pos * p.ldo + f, silu_mul(g0, u0), silu_mul(g1, u1));
      if constexpr (kEpi != Epi::kSwiGLU) {
        T* h = static_cast<T*>(kEpi == Epi::kStoreGLU ? p.out : p.out2) + pos * 2 * F;
        store2(h + f, g0, g1);
        store2(h + F + f, u0, u1);
      }
    }
  } else if constexpr (kEpi == Epi::kSwiGLUBwd) {
    // acc = g = dy_t @ Wd^T for columns f of F, h = [h_gate | h_up] (recomputed or saved by the
    // forward, x's dtype); the element math is swiglu_bwd. h is read in batches of kBatch pairs,
    // every load of a batch issued before its first store: the outputs may alias h as far as the
    // compiler knows, so a load placed after a store waits for it, and pair by pair the epilogue
    // would pay one memory latency per pair.
    const int F = p.N;
    const T* h = static_cast<const T*>(p.h);
    T* dh = static_cast<T*>(p.out);
    T* aw_out = static_cast<T*>(p.out2);
    const FragRows rows(p, w, wg, t, true);
    const bool* row_ok = rows.ok;
    const int64_t* pos = rows.pos;
    const float* wt = rows.weight;
    float dw_rows[2] = {0.f, 0.f};
    constexpr int kBatch = 8;  // pairs per batch (32 registers of h)
    static_assert(kValues % (2 * kBatch) == 0, "whole batches");
#pragma unroll
    for (int i0 = 0; i0 < kValues; i0 += 2 * kBatch) {
      float2 hg[kBatch], hu[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = i0 + 2 * b, rh = (i >> 1) & 1;
        const int f = w.n_tile * BN + frag_col(i, t);
        if (row_ok[rh] && f < F) {  // F is even: a pair is wholly in or out
          const T* hrow = h + pos[rh] * 2 * F;
          hg[b] = load2(hrow + f);
          hu[b] = load2(hrow + F + f);
        } else {
          hg[b] = hu[b] = make_float2(0.f, 0.f);
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = i0 + 2 * b, rh = (i >> 1) & 1;
        const int f = w.n_tile * BN + frag_col(i, t);
        if (!row_ok[rh] || f >= F) continue;
        const SwiGLUGrad d0 = swiglu_bwd(acc(i), hg[b].x, hu[b].x, wt[rh]);
        const SwiGLUGrad d1 = swiglu_bwd(acc(i + 1), hg[b].y, hu[b].y, wt[rh]);
        dw_rows[rh] += acc(i) * d0.a;
        dw_rows[rh] += acc(i + 1) * d1.a;
        T* dh_row = dh + pos[rh] * 2 * F;
        store2(dh_row + f, d0.dgate, d1.dgate);
        store2(dh_row + F + f, d0.dup, d1.dup);
        store2(aw_out + pos[rh] * F + f, d0.aw, d1.aw);
      }
    }
    store_dw_partials(p, w, rows, dw_rows, t);
  } else {
    const FragRows rows(p, w, wg, t, kEpi == Epi::kWeighted);  // weight 1 unweighted
    const float* wt = rows.weight;
#pragma unroll
    for (int i = 0; i < kValues; i += 2) {
      const int r = row_base + frag_row(i, t);
      const int n = w.n_tile * BN + frag_col(i, t);
      if (r >= w.rows || n >= p.N) continue;
      const int64_t row = w.row0 + r;
      if constexpr (kEpi == Epi::kWeighted) {
        const float s = wt[(i >> 1) & 1];
        store2(static_cast<T*>(p.out) + row * p.ldo + n, s * acc(i), s * acc(i + 1));
      } else if constexpr (kEpi == Epi::kStoreRows) {
        store2(static_cast<T*>(p.out) + row * p.ldo + n, acc(i), acc(i + 1));
      } else {  // kStoreCast: dW_e[m, n], M × N per expert
        T* out = static_cast<T*>(p.out) + (static_cast<int64_t>(w.expert) * p.M + row) * p.ldo;
        store2(out + n, acc(i), acc(i + 1));
      }
    }
  }
}

}  // namespace mok::cuda
