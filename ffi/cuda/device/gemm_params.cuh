// The grouped-GEMM description shared by the SIMT (oracle / f32) and wgmma (bf16) mainloops:
// which operand rows are gathered, where tile elements live in global memory, and which epilogue
// runs. Every operand tile is "rows × contiguous columns", loaded in 8-element chunks.
#pragma once

#include <cuda.h>  // CUtensorMap (types only; driver entry points are fetched at run time)

#include "cuda/device/route.cuh"

namespace mok::cuda {

// Routed-M: rows = sorted positions of one expert.  C[p, n] = Σ_k A[p, k] B_e[k, n].
//   kRoutedBN: B_e stored [K, N] (N contiguous): w_gate_up, w_down in the forward.
//   kRoutedBK: B_e stored [N, K] (K contiguous): w_down^T, w_gate_up^T in the backward.
// Routed-K (weight gradients): C_e[m, n] = Σ_{p in e} A[p, m] B[p, n], both stored by rows p.
constexpr int kWgmmaBN = 256;  // output columns per wgmma tile (mainloop_sm90.cuh)
constexpr int kSimtBN = 128;   // output columns per SIMT tile (simt.cuh)

enum class Mode { kRoutedBN, kRoutedBK, kRoutedK };

enum class Epi {
  kSwiGLU,      // a[p, f] = silu(h_gate) * h_up                       (x.dtype)
  kWeighted,    // y_part[p, n] = w[p] * acc                              (x.dtype)
  kStoreGLU,    // h[p, f] = gate, h[p, F + f] = up                       (x.dtype)
  kSwiGLUSave,  // kSwiGLU into `out`, and kStoreGLU's h into `out2`       (x.dtype)
  kSwiGLUBwd,   // from g = dy @ Wd^T and h: dh, w*a, partial d_w         (x.dtype, f32)
  kStoreRows,   // out[p, n] = acc                                        (x.dtype)
  kStoreCast,   // dW_e[m, n] = acc                                       (weight dtype)
  // mxfp8 through the BF16 GEMMs: kSwiGLU / kSwiGLUSave with a stored as deq(Q(a)), a quantized
  // along F in blocks of 32 from its float32 value (jax_mok.quantization.layer's Q(a)), so the
  // down GEMM's BF16 operand holds exactly the E4M3 x 2^e values the FP8 down GEMM would read.
  kSwiGLUMx,
  kSwiGLUSaveMx,
};

// The gate/up epilogues whose `a` is mxfp8-quantized-dequantized (wgmma, bf16 only).
constexpr bool IsMxGlu(Epi e) { return e == Epi::kSwiGLUMx || e == Epi::kSwiGLUSaveMx; }

struct GemmParams {
  // routing (device arrays)
  const int* expert_offset;  // [E+1]
  const int* mtile_prefix;   // [E+1]
  const int* sorted_token;   // [P] gather for x / dy rows
  const int* sorted_slot;    // [P] assignment index (routing weight of each row)
  int experts;
  // sizes: routed-M uses N, K; routed-K uses M, N (K = rows of the expert)
  int M, N, K;
  int n_tiles;     // output tiles along N
  int m_tiles;     // routed-K only: tiles along M
  bool glu;        // B tile = [gate cols | up cols]; output N = F
  int glu_offset;  // F: column offset of the up half inside B
  // operand A
  const void* a;
  int64_t lda;
  const int* a_gather;  // row p of A is a[a_gather[p]] (nullptr: row p)
  // operand B
  const void* b;
  int64_t b_expert_stride;  // routed-M only
  int64_t ldb;
  const int* b_gather;  // routed-K only
  // epilogue
  void* out;                  // primary output
  void* out2;                 // secondary output (kSwiGLUBwd: w*a; kSwiGLUSave: h)
  const void* h;              // kSwiGLUBwd: [P, 2F] gate/up pre-activations (x.dtype)
  const float* topk_weights;  // [T*k]
  float* dw_part;             // kSwiGLUBwd: [P, n_tiles]
  int64_t ldo;                // leading dimension of `out`
  // Routed-M: tiles are handed out in order by this counter (zeroed by the routing, one per GEMM
  // of a call; nullptr: CTA b runs tiles b, b + grid, ...). In order, the tiles running at one
  // time are always a window of consecutive ids, so the m-tiles of one expert's n-tile
  // (neighbouring ids) start within about a tile's time / grid of each other and read its weight
  // boxes from L2 after the first one's miss; with the static order the CTAs drift apart over
  // the waves (tiles differ in length: an expert's last, nearly empty m-tile idles a warpgroup)
  // and every m-tile read its weight boxes from DRAM.
  int* tile_counter;
  // wgmma path: the tensor map of B (routed-M: 3-D, [E][K][N] or [E][N][K]; routed-K: 2-D
  // [a_rows][N]), host/tma.h
  alignas(64) CUtensorMap tmap_b;
  int64_t a_rows;  // rows of the A allocation (T*k for the activations): the tensor maps' bound
  // wgmma path with A not gathered: the 2-D tensor map of A, [a_rows][K] (routed-K: [a_rows][M])
  alignas(64) CUtensorMap tmap_a;
  // wgmma path, staged row outputs: `out` as a 3-D tensor map in 64 x 64 boxes (routed-M:
  // [1][a_rows][N]; routed-K: [E][M][N]), host/tma.h
  alignas(64) CUtensorMap tmap_out;
};
static_assert(sizeof(GemmParams) <= 4096, "a __grid_constant__ kernel parameter (4 KB limit)");

template <int BN>
struct TileCols {
  // Global column of B for tile-local column c (-1 when out of range).
  __device__ __forceinline__ static int b_col(const GemmParams& p, int n_tile, int c) {
    if (!p.glu) {
      const int n = n_tile * BN + c;
      return n < p.N ? n : -1;
    }
    constexpr int kHalf = BN / 2;
    const int f = n_tile * kHalf + (c < kHalf ? c : c - kHalf);
    if (f >= p.N) return -1;
    return c < kHalf ? f : p.glu_offset + f;
  }
};

// Address of the 8-element chunk of a tile. Each returns nullptr for chunks outside the
// problem (zero-filled). `r` is the tile row and `k0` the absolute K of the chunk's first element.
template <class T, Mode kMode, int BN>
struct Operands {
  // Element `col` of the operand row at position `pos` (row gather[pos], or pos without gather).
  __device__ __forceinline__ static const T* row_at(const void* base, const int* gather, int64_t ld,
                                                    int pos, int col) {
    const int64_t row = gather ? gather[pos] : pos;
    return static_cast<const T*>(base) + row * ld + col;
  }
  // A, routed-M: tile rows are positions (row0 + r), chunks run along K.
  __device__ __forceinline__ static const T* a_routed(const GemmParams& p, int row0, int rows,
                                                      int r, int k) {
    if (r >= rows || k >= p.K) return nullptr;
    return row_at(p.a, p.a_gather, p.lda, row0 + r, k);
  }
  // B, routed-M, for tile column c and absolute k.
  __device__ __forceinline__ static const T* b_routed(const GemmParams& p, int e, int n_tile, int c,
                                                      int k) {
    const int col = TileCols<BN>::b_col(p, n_tile, c);
    if (col < 0 || k >= p.K) return nullptr;
    const T* base = static_cast<const T*>(p.b) + e * p.b_expert_stride;
    if constexpr (kMode == Mode::kRoutedBN)
      return base + static_cast<int64_t>(k) * p.ldb + col;
    else
      return base + static_cast<int64_t>(col) * p.ldb + k;
  }
  // Routed-K: row `kk` (0-based inside the expert of `count` rows starting at `off`), column m/n.
  __device__ __forceinline__ static const T* a_wgrad(const GemmParams& p, int off, int count,
                                                     int kk, int m) {
    if (kk >= count || m >= p.M) return nullptr;
    return row_at(p.a, p.a_gather, p.lda, off + kk, m);
  }
  __device__ __forceinline__ static const T* b_wgrad(const GemmParams& p, int off, int count,
                                                     int kk, int n) {
    if (kk >= count || n >= p.N) return nullptr;
    return row_at(p.b, p.b_gather, p.ldb, off + kk, n);
  }
};

// A work item of either mode, decoded identically by producer and consumers.
struct WorkTile {
  int expert;
  int row0, rows;  // routed-M: positions; routed-K: m0 and valid m rows
  int n_tile;
  int k_off, k_len;  // routed-K: the expert's first position and count; routed-M: 0, K
};

// The tile schedule of a grouped GEMM. Params: GemmParams, or the FP8 kernels' Fp8GemmParams
// (fp8_gemm.cuh), which carries the same schedule fields and the same 128-row tiles.
template <Mode kMode, class Params>
__device__ __forceinline__ int total_tiles(const Params& p, const int* s_prefix) {
  if constexpr (kMode == Mode::kRoutedK)
    return p.experts * p.m_tiles * p.n_tiles;
  else
    return s_prefix[p.experts] * p.n_tiles;
}

template <Mode kMode, class Params>
__device__ __forceinline__ WorkTile decode_tile(const Params& p, int tile, const int* s_prefix,
                                                const int* s_offset) {
  WorkTile w;
  if constexpr (kMode == Mode::kRoutedK) {
    const int per_expert = p.m_tiles * p.n_tiles;
    w.expert = tile / per_expert;
    const int local = tile - w.expert * per_expert;
    w.n_tile = local / p.m_tiles;
    w.row0 = (local - w.n_tile * p.m_tiles) * kTileM;
    w.rows = min(kTileM, p.M - w.row0);
    w.k_off = s_offset[w.expert];
    w.k_len = s_offset[w.expert + 1] - w.k_off;
  } else {
    const RoutedTile t = decode_routed_tile(tile, s_prefix, s_offset, p.experts, p.n_tiles);
    w.expert = t.expert;
    w.row0 = t.row0;
    w.rows = t.rows;
    w.n_tile = t.n_tile;
    w.k_off = 0;
    w.k_len = p.K;
  }
  return w;
}

}  // namespace mok::cuda
