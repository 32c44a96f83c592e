// FP8 quantization kernels of the layer (formats: fp8_format.cuh), and the FP8 GEMMs' schedule.
//   quantize_rows     : rows of a contiguous [rows][C] matrix -> FP8 [rows][C] and scales
//                       along C (C / 32 bytes per row); the backward's dh, and mok_quantize.
//   quantize_segments : the weight gradients' operands: rows in expert order -> FP8 [C][Pmax],
//                       transposed, quantized along the positions of each expert; each expert's
//                       positions start at k_offset[e] (a multiple of 128) and its last block is
//                       zero-padded, so no scale block spans two experts.
//   quantize_weight   : expert weights w [E][A][B] in one pass (one 128 x 128 tile per CTA) into
//                       the layouts the GEMMs read: along A (values [E][B][A]) and/or along B
//                       (values [E][A][B]), jax_mok.quantization's bits.
//   fp8_schedule      : from expert_offset, the 64-row tile prefix of the routed GEMMs and
//   k_offset.
#pragma once

#include <algorithm>
#include <type_traits>

#include "cuda/device/fp8_format.cuh"
#include "cuda/device/ptx.cuh"

namespace mok::cuda::fp8 {

// 16-byte words holding 8 elements of T: one for bf16, two for float32.
template <class T>
constexpr int kWords8 = sizeof(T) / 2;

// Eight elements of T held in kWords8<T> 16-byte words, as floats. bf16 from each 32-bit word
// directly: the low element's bits shifted to the top half, the high element's masked in place
// (exact, as to_float; converting element by element took a byte permute and a shift each).
template <class T>
__device__ __forceinline__ void float8_of(const uint4* raw, float* f) {
  if constexpr (std::is_same_v<T, bf16>) {
    const uint32_t w[4] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      f[2 * k] = __uint_as_float(w[k] << 16);
      f[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
    }
  } else {
    const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = to_float(e[j]);
  }
}

// Rows of a contiguous [rows][C] matrix (C a multiple of 128) as a flat sequence of 128-element
// items: item i is elements [128 i, 128 i + 128), its E4M3 values bytes [128 i, 128 i + 128) of
// `out` and its scales the 4 bytes [4 i, 4 i + 4) of `scales` (both recipes keep 4 scale bytes
// per 128 elements of a row; rows and their scales follow each other), so no (row, column) pair
// is computed. Eight lanes per item: lane l holds elements 8l..8l+7 ("part 0") and
// 64 + 8l..64 + 8l + 7 ("part 1"), so each 16-byte load instruction of an 8-lane group reads 128
// contiguous bytes (bf16) and a warp 512. Blocks: fp8_block's is the item (8 lanes), mxfp8's 32
// elements are 4 lanes of one part. Why 16 elements a lane: the per-block work (shuffles, the
// scale's divisions, the scale store) is paid once per 256 bytes read, and the bracket test over
// 8 pairs takes one branch; at 8 elements a lane (a half-warp per item, with row and column
// arithmetic per item) the pass was bound by issue slots rather than by memory.
constexpr int kFlatItems = 2;  // items per thread per round, all loads issued before first use

template <class T, Recipe R>
__global__ void __launch_bounds__(256)
    quantize_rows_kernel(const T* __restrict__ src, int rows, const int* rows_limit, int cols,
                         uint8_t* __restrict__ out, uint8_t* __restrict__ scales) {
  constexpr int kVec = kWords8<T>;  // 16-byte words per part
  const int l = threadIdx.x & 7;
  const int64_t limit = rows_limit ? min(rows, *rows_limit) : rows;
  const int64_t items = limit * (cols / 128);
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 3);
  const int64_t group = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 3;
  // Every lane of a warp runs every round (the shuffles take the whole warp): the rounds run
  // while the warp's first group (groups 4w..4w+3 are warp w's) has an item; a group past the
  // last item quantizes zeros and stores nothing.
  const int64_t warp_group = group & ~static_cast<int64_t>(3);
  for (int64_t r0 = 0; warp_group + r0 < items; r0 += kFlatItems * groups) {
    uint4 raw[kFlatItems][2][kVec];
#pragma unroll
    for (int u = 0; u < kFlatItems; ++u) {
      const int64_t item = group + r0 + u * groups;
#pragma unroll
      for (int p = 0; p < 2; ++p)
#pragma unroll
        for (int v = 0; v < kVec; ++v)
          raw[u][p][v] =
              item < items
                  ? __ldcs(reinterpret_cast<const uint4*>(src + item * 128 + 64 * p + 8 * l) + v)
                  : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kFlatItems; ++u) {
      const int64_t item = group + r0 + u * groups;
      float f[2][8];
#pragma unroll
      for (int p = 0; p < 2; ++p) float8_of<T>(raw[u][p], f[p]);
      BlockScale s[2];  // of part 0 and part 1 (fp8_block: the same block)
      if constexpr (R == Recipe::kBlock) {
        float m = 0.f;
#pragma unroll
        for (int j = 0; j < 16; ++j) m = amax_combine(m, f[j >> 3][j & 7]);
#pragma unroll
        for (int d = 1; d < 8; d <<= 1) m = amax_combine(m, __shfl_xor_sync(0xffffffffu, m, d));
        s[0] = s[1] = block_scale<R>(m);
      } else {
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          float m = 0.f;
#pragma unroll
          for (int j = 0; j < 8; ++j) m = amax_combine(m, f[p][j]);
#pragma unroll
          for (int d = 1; d < 4; d <<= 1) m = amax_combine(m, __shfl_xor_sync(0xffffffffu, m, d));
          s[p] = block_scale<R>(m);
        }
      }
      uint16_t q[8];  // pair j: part j / 4, values 2 (j % 4), 2 (j % 4) + 1
      quantize_pairs<R, 8>(
          [&](int j) { return make_float2(f[j >> 2][2 * (j & 3)], f[j >> 2][2 * (j & 3) + 1]); },
          [&](int j) -> const BlockScale& { return s[j >> 2]; },
          [&](int j, uint16_t bytes) { q[j] = bytes; });
      uint32_t scale_word = s[0].stored;  // the item's 4 scale bytes
      if constexpr (R == Recipe::kMx) {
        // Lane 0 holds blocks 0 (part 0) and 2 (part 1), lane 4 blocks 1 and 3.
        const uint32_t mine = s[0].stored | (s[1].stored << 16);
        scale_word = mine | (__shfl_xor_sync(0xffffffffu, mine, 4) << 8);
      }
      if (item >= items) continue;
#pragma unroll
      for (int p = 0; p < 2; ++p)
        *reinterpret_cast<uint2*>(out + item * 128 + 64 * p + 8 * l) =
            make_uint2(q[4 * p] | (static_cast<uint32_t>(q[4 * p + 1]) << 16),
                       q[4 * p + 2] | (static_cast<uint32_t>(q[4 * p + 3]) << 16));
      if (l == 0) *reinterpret_cast<uint32_t*>(scales + 4 * item) = scale_word;
    }
  }
}

// The rows of a contiguous [rows][cols] matrix (rows past *rows_limit, where given, untouched).
// The grid is what the SMs hold at once (the occupancy query: registers bound it), or fewer CTAs
// where the matrix has fewer items (32 per CTA per round).
template <class T, Recipe R>
cudaError_t launch_quantize_rows(const T* src, int rows, const int* rows_limit, int cols,
                                 uint8_t* out, uint8_t* scales, int num_sms, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  auto* kernel = quantize_rows_kernel<T, R>;
  int per_sm = 0;
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, 0);
  if (err != cudaSuccess) return err;
  const int64_t needed = (static_cast<int64_t>(rows) * (cols / 128) + 31) / 32;
  const int blocks =
      static_cast<int>(std::min<int64_t>(needed, int64_t{num_sms} * std::max(per_sm, 1)));
  kernel<<<blocks, 256, 0, stream>>>(src, rows, rows_limit, cols, out, scales);
  return cudaGetLastError();
}

// deq(Q(src)) of mxfp8 in bf16 (mx_qdq_pair): src and dst hold `blocks` blocks of 32
// consecutive elements (the rows of a [rows][C] matrix with C % 32 == 0, in row order). A block
// is 64 bytes: 4 lanes of a warp with 16 bytes each, so a warp's loads and stores are 512
// contiguous bytes (one load per lane per segment; a thread owning a whole block made each warp
// instruction touch 32 sectors half used, ~80 % of the copy rate on an H100). The block's amax
// is each lane's 8 values, then two quad shuffles. kMxSegs segments per warp keep that many
// loads in flight per thread. mxfp8 through the BF16 GEMMs: dh before dh·Wgu^T (dh itself stays
// the dWgu operand), x, dy and the weights along their rows. src is read once: evict-first. (A
// template: one definition across the translation units that include this header.)
constexpr int kMxSegs = 4;
template <class T>
__global__ void __launch_bounds__(256)
    mx_qdq_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t blocks) {
  static_assert(std::is_same_v<T, bf16>, "bf16 rows");
  const int64_t chunks = blocks * 4;  // 16-byte chunks, 4 per block
  const int64_t first = ((static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x) >> 5) * kMxSegs;
  const int lane = threadIdx.x & 31;
  uint4 raw[kMxSegs];
#pragma unroll
  for (int g = 0; g < kMxSegs; ++g) {
    const int64_t c = (first + g) * 32 + lane;
    raw[g] = c < chunks ? __ldcs(reinterpret_cast<const uint4*>(src) + c) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int g = 0; g < kMxSegs; ++g) {
    float f[8];
    float8_of<bf16>(&raw[g], f);
    float m = 0.f;
#pragma unroll
    for (int l = 0; l < 8; ++l) m = amax_combine(m, f[l]);
    // every lane shuffles (a quad past the end holds zeros and stores nothing)
    const BlockScale bs = block_scale<Recipe::kMx>(quad_amax(m));
    uint32_t out[4];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const float2 q = mx_qdq_pair(make_float2(f[2 * l], f[2 * l + 1]), bs);
      const __nv_bfloat162 pair = __floats2bfloat162_rn(q.x, q.y);
      out[l] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    const int64_t c = (first + g) * 32 + lane;
    if (c < chunks) reinterpret_cast<uint4*>(dst)[c] = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

// deq(Q(src)) of mxfp8 along A of [E][A][B] (A % 32 == 0, B even), in bf16: one thread per
// (expert, block of 32 rows, pair of columns), so that a warp's loads of one row are 128
// contiguous bytes; the 32 rows of a block are 32 loads of one 32-bit word, B / 2 words apart.
template <class T>
__global__ void __launch_bounds__(256)
    mx_qdq_cols_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t experts,
                       int64_t a_dim, int64_t b_dim) {
  static_assert(std::is_same_v<T, bf16>, "bf16 weights");
  const int64_t pairs = b_dim / 2, blocks = a_dim / 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (i >= experts * blocks * pairs) return;
  const int64_t c = i % pairs, block = i / pairs;  // block = expert * blocks + block of A
  const int64_t first = (block / blocks * a_dim + block % blocks * 32) * pairs + c;  // in words
  const uint32_t* s = reinterpret_cast<const uint32_t*>(src) + first;
  float lo[32], hi[32];  // the pair's two columns
  float m_lo = 0.f, m_hi = 0.f;
#pragma unroll
  for (int r = 0; r < 32; ++r) {
    const uint32_t w = __ldcs(s + r * pairs);
    lo[r] = __uint_as_float(w << 16);
    hi[r] = __uint_as_float(w & 0xFFFF0000u);
    m_lo = amax_combine(m_lo, lo[r]);
    m_hi = amax_combine(m_hi, hi[r]);
  }
  const BlockScale s_lo = block_scale<Recipe::kMx>(m_lo), s_hi = block_scale<Recipe::kMx>(m_hi);
  uint32_t* d = reinterpret_cast<uint32_t*>(dst) + first;
#pragma unroll
  for (int r = 0; r < 32; r += 2) {
    const float2 q_lo = mx_qdq_pair(make_float2(lo[r], lo[r + 1]), s_lo);
    const float2 q_hi = mx_qdq_pair(make_float2(hi[r], hi[r + 1]), s_hi);
    const __nv_bfloat162 row0 = __floats2bfloat162_rn(q_lo.x, q_hi.x);
    const __nv_bfloat162 row1 = __floats2bfloat162_rn(q_lo.y, q_hi.y);
    d[r * pairs] = *reinterpret_cast<const uint32_t*>(&row0);
    d[(r + 1) * pairs] = *reinterpret_cast<const uint32_t*>(&row1);
  }
}

inline cudaError_t launch_mx_qdq_cols(const bf16* src, bf16* dst, int64_t experts, int64_t a_dim,
                                      int64_t b_dim, cudaStream_t stream) {
  const int64_t threads = experts * (a_dim / 32) * (b_dim / 2);
  if (threads == 0) return cudaSuccess;
  mx_qdq_cols_kernel<bf16><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
      src, dst, experts, a_dim, b_dim);
  return cudaGetLastError();
}

// n elements (a multiple of 32; both pointers 16-byte aligned).
inline cudaError_t launch_mx_qdq(const bf16* src, bf16* dst, int64_t n, cudaStream_t stream) {
  const int64_t blocks = n / 32;
  if (blocks == 0) return cudaSuccess;
  const int64_t per_cta = 8 * kMxSegs * 8;  // blocks: 8 warps of kMxSegs segments of 8 blocks
  mx_qdq_kernel<bf16><<<static_cast<unsigned>((blocks + per_cta - 1) / per_cta), 256, 0, stream>>>(
      src, dst, blocks);
  return cudaGetLastError();
}

constexpr int kSegRows = 128, kSegCols = 64;
// Column tiles in flight per CTA: 16 KB each for bf16 (32 KB for float32), ~64 KB of ring.
template <class T>
constexpr int kSegStages = sizeof(T) == 2 ? 4 : 2;
template <class T>
constexpr size_t seg_smem_bytes() {
  return static_cast<size_t>(kSegStages<T>) * kSegRows * kSegCols * sizeof(T) +
         kSegRows * sizeof(int64_t) + 4 * kSegCols * sizeof(float);
}

// One CTA per 128 padded positions: it resolves their source rows once, then walks all column
// tiles of 64, the next kSegStages - 1 tiles' rows in flight by cp.async (16-byte chunks, zero-
// filled for padding rows) while it quantizes the current one: a pass of short CTAs spent most
// of each CTA's life resolving rows and waiting on its one batch of loads. Per tile, thread
// (c = tid % 64, q = tid / 64) quantizes the 32 positions 32q.. of column c, read straight from
// the staged rows in T (a warp reads 32 consecutive columns of one row: no bank conflict), and
// stores them as two 16-byte vectors. fp8_block's block is a column's 128 positions, held by four
// threads of different warps: their partial amaxes meet in smem.
template <class T, Recipe R>
__global__ void __launch_bounds__(256)
    quantize_segments_kernel(const T* __restrict__ src, int64_t ld, const int* gather,
                             const int* __restrict__ expert_offset,
                             const int* __restrict__ k_offset, int experts, int cols,
                             int64_t padded_rows, uint8_t* __restrict__ out,
                             uint8_t* __restrict__ scales) {
  constexpr int kStages = kSegStages<T>;
  constexpr int kVec = 16 / sizeof(T);      // elements per 16-byte chunk
  constexpr int kChunks = kSegCols / kVec;  // chunks per tile row
  constexpr int kTile = kSegRows * kSegCols;
  extern __shared__ uint4 seg_smem[];
  T* tiles = reinterpret_cast<T*>(seg_smem);  // [kStages][kSegRows][kSegCols]
  int64_t* src_row = reinterpret_cast<int64_t*>(tiles + kStages * kTile);
  float* part_amax = reinterpret_cast<float*>(src_row + kSegRows);  // [4][kSegCols]
  const int p0 = blockIdx.x * kSegRows, tid = threadIdx.x;
  if (p0 >= k_offset[experts]) return;  // past the last expert's padded positions
  if (tid < kSegRows) {
    const int p = p0 + tid;
    int lo = 0, hi = experts;  // the expert e with k_offset[e] <= p < k_offset[e + 1]
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (k_offset[mid] <= p)
        lo = mid;
      else
        hi = mid;
    }
    const int local = p - k_offset[lo];
    const int pos = expert_offset[lo] + local;
    src_row[tid] =
        local < expert_offset[lo + 1] - expert_offset[lo] ? (gather ? gather[pos] : pos) : -1;
  }
  __syncthreads();
  const int n_tiles = cols / kSegCols;
  auto issue = [&](int ct) {  // column tile ct into stage ct % kStages
    const uint32_t stage = smem_u32(tiles + (ct % kStages) * kTile);
#pragma unroll
    for (int i = tid; i < kSegRows * kChunks; i += 256) {
      const int r = i / kChunks, ch = i % kChunks;
      const int64_t row = src_row[r];
      cp_async_16(stage + (r * kSegCols + ch * kVec) * sizeof(T),
                  row >= 0 ? src + row * ld + ct * kSegCols + ch * kVec : src, row >= 0);
    }
  };
#pragma unroll
  for (int ct = 0; ct < kStages - 1; ++ct) {
    if (ct < n_tiles) issue(ct);
    cp_async_commit();  // an empty group past the last tile keeps the count uniform
  }
  const int c = tid & (kSegCols - 1), q = tid / kSegCols;
  uint8_t* col_out = out + p0 + 32 * q;
  for (int ct = 0; ct < n_tiles; ++ct) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile ct have landed
    __syncthreads();               // everyone's have; and tile ct - 1's stage is no longer read
    if (ct + kStages - 1 < n_tiles) issue(ct + kStages - 1);
    cp_async_commit();
    const T* t = tiles + (ct % kStages) * kTile + 32 * q * kSegCols + c;
    float x[32];
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      x[j] = to_float(t[j * kSegCols]);
      m = amax_combine(m, x[j]);
    }
    if constexpr (R == Recipe::kBlock) {
      part_amax[q * kSegCols + c] = m;
      __syncthreads();
#pragma unroll
      for (int k = 0; k < 4; ++k) m = amax_combine(m, part_amax[k * kSegCols + c]);
    }
    const BlockScale s = block_scale<R>(m);
    uint32_t words[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t lo = quantize_pair<R>(make_float2(x[4 * j], x[4 * j + 1]), s);
      const uint32_t hi = quantize_pair<R>(make_float2(x[4 * j + 2], x[4 * j + 3]), s);
      words[j] = lo | (hi << 16);
    }
    const int col = ct * kSegCols + c;
    uint8_t* dst = col_out + static_cast<int64_t>(col) * padded_rows;
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(words[0], words[1], words[2], words[3]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(words[4], words[5], words[6], words[7]);
    uint8_t* col_scales = scales + static_cast<int64_t>(col) * (padded_rows / 32);
    if constexpr (R == Recipe::kMx) {
      col_scales[p0 / 32 + q] = static_cast<uint8_t>(s.stored);
    } else {
      if (q == 0) reinterpret_cast<uint32_t*>(col_scales)[p0 / 128] = s.stored;
    }
  }
  cp_async_wait<0>();  // no copy outstanding at exit (only empty groups remain)
}

template <class T, Recipe R>
cudaError_t launch_quantize_segments(const T* src, int64_t ld, const int* gather,
                                     const int* expert_offset, const int* k_offset, int experts,
                                     int cols, int64_t padded_rows, uint8_t* out, uint8_t* scales,
                                     cudaStream_t stream) {
  constexpr size_t smem = seg_smem_bytes<T>();
  auto* kernel = quantize_segments_kernel<T, R>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(padded_rows / kSegRows), 256, smem, stream>>>(
      src, ld, gather, expert_offset, k_offset, experts, cols, padded_rows, out, scales);
  return cudaGetLastError();
}

// ------------------------------------------------------------------ expert weights
// w [E][A][B] (B contiguous; A and B multiples of 128), one 128 x 128 tile (rows a0.., columns
// b0..) per CTA, staged once in shared memory in w's own dtype and written in each requested
// layout:
//   along A (the forward's reduction: w_gate_up along H, w_down along F): values [E][B][A],
//     scales mxfp8 [E][B][A/32] (E8M0), fp8_block [E][B/128][A/128] (float32);
//   along B (the backward's): values [E][A][B], scales mxfp8 [E][A][B/32], fp8_block
//     [E][A/128][B/128].
// fp8_block: the tile is one 128 x 128 scale block, so both layouts hold the same values and
// scale. mxfp8: blocks of 32 down a column (along A) and along a row (along B) of the tile.
// Bytes: the weight read once, one E4M3 byte per element per layout written. The tile stays in
// w's dtype (34 KB for bf16) so that six CTAs share an SM and one's loads overlap another's
// stores.
struct QuantizedOut {
  uint8_t* values = nullptr;  // nullptr: this layout is not written
  uint8_t* scales = nullptr;
};
constexpr int kWTile = 128;
template <class T>
constexpr int kWTileLd = kWTile + 16 / sizeof(T);  // row stride (elements): 16-byte aligned rows
template <class T>
constexpr size_t kWeightSmemBytes = sizeof(T) * kWTile * kWTileLd<T>;

template <class T, Recipe R>
__global__ void __launch_bounds__(256)
    quantize_weight_kernel(const T* __restrict__ w, int64_t a_dim, int64_t b_dim,
                           QuantizedOut along_a, QuantizedOut along_b) {
  constexpr int kLd = kWTileLd<T>;
  extern __shared__ uint4 weight_tile_raw[];
  T* tile = reinterpret_cast<T*>(weight_tile_raw);  // [128][kLd]
  __shared__ float warp_amax[8];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t tiles_b = b_dim / kWTile, tiles_a = a_dim / kWTile;
  const int64_t tb = blockIdx.x % tiles_b, ta = (blockIdx.x / tiles_b) % tiles_a;
  const int64_t e = blockIdx.x / (tiles_b * tiles_a);
  const int64_t a0 = ta * kWTile, b0 = tb * kWTile;

  // Stage the tile: 16-byte loads, every one issued before the first store; a quarter-warp
  // stores 128 contiguous bytes of one row (no bank conflicts).
  constexpr int kVec = 16 / sizeof(T), kChunks = kWTile / kVec, kPerThread = kWTile * kChunks / 256;
  const T* src = w + (e * a_dim + a0) * b_dim + b0;
  uint4 raw[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = tid + 256 * j, r = i / kChunks, c = (i % kChunks) * kVec;
    raw[j] = *reinterpret_cast<const uint4*>(src + r * b_dim + c);
  }
  float m = 0.f;  // fp8_block: this thread's share of the tile's amax
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = tid + 256 * j, r = i / kChunks, c = (i % kChunks) * kVec;
    *reinterpret_cast<uint4*>(tile + r * kLd + c) = raw[j];
    if constexpr (R == Recipe::kBlock) {
      const T* el = reinterpret_cast<const T*>(&raw[j]);
#pragma unroll
      for (int v = 0; v < kVec; ++v) m = amax_combine(m, to_float(el[v]));
    }
  }
  BlockScale tile_scale;
  if constexpr (R == Recipe::kBlock) {
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) m = amax_combine(m, __shfl_xor_sync(0xffffffffu, m, d));
    if (lane == 0) warp_amax[warp] = m;
  }
  __syncthreads();
  if constexpr (R == Recipe::kBlock) {
    m = warp_amax[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) m = amax_combine(m, warp_amax[i]);
    tile_scale = block_scale<R>(m);
    if (tid == 0) {
      if (along_a.scales)  // [E][B/128][A/128]
        reinterpret_cast<uint32_t*>(along_a.scales)[(e * tiles_b + tb) * tiles_a + ta] =
            tile_scale.stored;
      if (along_b.scales)  // [E][A/128][B/128]
        reinterpret_cast<uint32_t*>(along_b.scales)[(e * tiles_a + ta) * tiles_b + tb] =
            tile_scale.stored;
    }
  }

  // Along B: a warp per tile row, lane l holding columns 4l..4l+3; mxfp8 blocks are 8 lanes.
  if (along_b.values) {
    for (int r = warp; r < kWTile; r += 8) {
      const T* row_in = tile + r * kLd + 4 * lane;
      const float4 v = make_float4(to_float(row_in[0]), to_float(row_in[1]), to_float(row_in[2]),
                                   to_float(row_in[3]));
      BlockScale s = tile_scale;
      if constexpr (R == Recipe::kMx) {
        float bm = amax_combine(amax_combine(amax_combine(amax_combine(0.f, v.x), v.y), v.z), v.w);
#pragma unroll
        for (int d = 1; d < 8; d <<= 1) bm = amax_combine(bm, __shfl_xor_sync(0xffffffffu, bm, d));
        s = block_scale<R>(bm);
      }
      const uint32_t q = quantize_pair<R>(make_float2(v.x, v.y), s) |
                         (static_cast<uint32_t>(quantize_pair<R>(make_float2(v.z, v.w), s)) << 16);
      const int64_t row = e * a_dim + a0 + r;
      *reinterpret_cast<uint32_t*>(along_b.values + row * b_dim + b0 + 4 * lane) = q;
      if constexpr (R == Recipe::kMx) {
        // The row's 4 block bytes as one word, from lanes 0, 8, 16, 24.
        const uint32_t byte = s.stored;
        const uint32_t word =
            __shfl_sync(0xffffffffu, byte, 0) | (__shfl_sync(0xffffffffu, byte, 8) << 8) |
            (__shfl_sync(0xffffffffu, byte, 16) << 16) | (__shfl_sync(0xffffffffu, byte, 24) << 24);
        if (lane == 0)
          *reinterpret_cast<uint32_t*>(along_b.scales + row * (b_dim / 32) + b0 / 32) = word;
      }
    }
  }

  // Along A: thread (column c, block q) quantizes rows 32q..32q+31 of column c (consecutive
  // threads read consecutive columns: no bank conflicts): 32 bytes of output row b0 + c. The
  // transposed FP8 tile is staged in shared memory over the input tile (once every thread has
  // read its columns) and leaves as whole 128-byte rows, a quarter-warp per row, so that a warp
  // store writes 4 full rows rather than 16-byte pieces of 32 rows (which kept the SM-to-L2
  // crossbar busy and the pass below the HBM rate). mxfp8: the 4 block bytes
  // of output row b0 + c (two threads' two passes) meet in shared memory and leave as one 32-bit
  // store per row; stored byte by byte, they were a third of the tile's store transactions.
  if (along_a.values) {
    __shared__ uint32_t row_scales[kWTile];
    constexpr int kOutLd = kWTile + 16;  // staged row stride (bytes): a quarter-warp's 16-byte
                                         // stores to 8 consecutive rows hit distinct banks
    static_assert(kOutLd * kWTile <= static_cast<int>(kWeightSmemBytes<T>), "staging fits");
    const int c = tid & 127;
    uint4 out[2][2];  // pass, half: 32 bytes of output row b0 + c at 32 q
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int q = (tid >> 7) + 2 * pass;
      float col[32];
#pragma unroll
      for (int j = 0; j < 32; ++j) col[j] = to_float(tile[(32 * q + j) * kLd + c]);
      BlockScale s = tile_scale;
      if constexpr (R == Recipe::kMx) {
        float bm = 0.f;
#pragma unroll
        for (int j = 0; j < 32; ++j) bm = amax_combine(bm, col[j]);
        s = block_scale<R>(bm);
      }
      uint32_t words[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        words[j] =
            quantize_pair<R>(make_float2(col[4 * j], col[4 * j + 1]), s) |
            (static_cast<uint32_t>(quantize_pair<R>(make_float2(col[4 * j + 2], col[4 * j + 3]), s))
             << 16);
      out[pass][0] = make_uint4(words[0], words[1], words[2], words[3]);
      out[pass][1] = make_uint4(words[4], words[5], words[6], words[7]);
      if constexpr (R == Recipe::kMx)
        reinterpret_cast<uint8_t*>(row_scales)[4 * c + q] = static_cast<uint8_t>(s.stored);
    }
    __syncthreads();  // every thread has read its columns (and along B its rows) of the tile
    uint8_t* staged = reinterpret_cast<uint8_t*>(weight_tile_raw);  // [128][kOutLd]
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int q = (tid >> 7) + 2 * pass;
      uint4* dst = reinterpret_cast<uint4*>(staged + c * kOutLd + 32 * q);
      dst[0] = out[pass][0];
      dst[1] = out[pass][1];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // 128 rows x 8 chunks of 16 bytes
      const int i = tid + 256 * k, r = i >> 3, chunk = i & 7;
      const int64_t row = e * b_dim + b0 + r;
      *reinterpret_cast<uint4*>(along_a.values + row * a_dim + a0 + 16 * chunk) =
          *reinterpret_cast<const uint4*>(staged + r * kOutLd + 16 * chunk);
    }
    if constexpr (R == Recipe::kMx) {
      if (tid < kWTile)  // a_dim / 32 and a0 / 32 are multiples of 4: aligned words
        *reinterpret_cast<uint32_t*>(along_a.scales + (e * b_dim + b0 + tid) * (a_dim / 32) +
                                     a0 / 32) = row_scales[tid];
    }
  }
}

template <class T, Recipe R>
cudaError_t launch_quantize_weight(const T* w, int64_t experts, int64_t a_dim, int64_t b_dim,
                                   QuantizedOut along_a, QuantizedOut along_b,
                                   cudaStream_t stream) {
  const int64_t tiles = experts * (a_dim / kWTile) * (b_dim / kWTile);
  if (tiles == 0) return cudaSuccess;
  auto* kernel = quantize_weight_kernel<T, R>;
  constexpr size_t smem = kWeightSmemBytes<T>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(tiles), 256, smem, stream>>>(w, a_dim, b_dim, along_a, along_b);
  return cudaGetLastError();
}

// One block: k_offset[e] = the counts of the experts before e, each rounded up to 128 (the
// weight gradients' padded positions), the total at [E].
static __global__ void fp8_schedule_kernel(const int* __restrict__ expert_offset, int experts,
                                           int* __restrict__ k_offset) {
  __shared__ int carry;
  __shared__ int warp_sums[32];
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int e0 = 0; e0 < experts; e0 += blockDim.x) {
    const int e = e0 + threadIdx.x;
    const int count = e < experts ? expert_offset[e + 1] - expert_offset[e] : 0;
    const int v = (count + 127) / 128 * 128;
    int inc = v;
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, inc, d);
      if (lane >= d) inc += o;
    }
    if (lane == 31) warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
      int w = lane < warps ? warp_sums[lane] : 0;
      for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, w, d);
        if (lane >= d) w += o;
      }
      warp_sums[lane] = w;
    }
    __syncthreads();
    const int pos = carry + inc - v + (warp > 0 ? warp_sums[warp - 1] : 0);
    if (e < experts) k_offset[e] = pos;
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) carry = pos + v;
    __syncthreads();
  }
  if (threadIdx.x == 0) k_offset[experts] = carry;
}

}  // namespace mok::cuda::fp8
