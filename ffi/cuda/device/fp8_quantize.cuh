// FP8 quantization kernels of the layer (formats: fp8_format.cuh), and the FP8 GEMMs' schedule.
//   quantize_rows     : rows of a [rows][C] matrix (optionally gathered) -> FP8 [rows][C] and
//   scales
//                       along C (C / 32 bytes per row); the backward's dh, and mok_quantize.
//   quantize_segments : the weight gradients' operands: rows in expert order -> FP8 [C][Pmax],
//                       transposed, quantized along the positions of each expert; each expert's
//                       positions start at k_offset[e] (a multiple of 128) and its last block is
//                       zero-padded, so no scale block spans two experts.
//   fp8_schedule      : from expert_offset, the 64-row tile prefix of the routed GEMMs and
//   k_offset.
#pragma once

#include "cuda/device/fp8_format.cuh"
#include "cuda/device/ptx.cuh"

namespace mok::cuda::fp8 {

// One warp per 128 columns of a row: lane l holds columns 4l..4l+3.
template <class T, Recipe R>
__global__ void quantize_rows_kernel(const T* __restrict__ src, int64_t ld, const int* gather,
                                     int rows, const int* rows_limit, int cols,
                                     uint8_t* __restrict__ out, uint8_t* __restrict__ scales) {
  const int lane = threadIdx.x & 31;
  const int limit = rows_limit ? min(rows, *rows_limit) : rows;
  const int chunks = cols / 128;
  const int64_t work = static_cast<int64_t>(limit) * chunks;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t item = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
       item < work; item += warps) {
    const int row = static_cast<int>(item / chunks), c0 = static_cast<int>(item % chunks) * 128;
    const int64_t src_row = gather ? gather[row] : row;
    const float4 v = load4(src + src_row * ld + c0 + 4 * lane);
    float m = amax_combine(amax_combine(amax_combine(amax_combine(0.f, v.x), v.y), v.z), v.w);
    constexpr int kLanes = kScaleBlock<R> / 4;  // lanes per scale block: 8 or 32
#pragma unroll
    for (int d = 1; d < kLanes; d <<= 1) m = amax_combine(m, __shfl_xor_sync(0xffffffffu, m, d));
    const BlockScale s = block_scale<R>(m);
    const uint32_t q = quantize_pair<R>(make_float2(v.x, v.y), s) |
                       (static_cast<uint32_t>(quantize_pair<R>(make_float2(v.z, v.w), s)) << 16);
    *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(row) * cols + c0 + 4 * lane) = q;
    uint8_t* row_scales = scales + static_cast<int64_t>(row) * (cols / 32);
    if constexpr (R == Recipe::kMx) {
      if ((lane & 7) == 0) row_scales[c0 / 32 + lane / 8] = static_cast<uint8_t>(s.stored);
    } else {
      if (lane == 0) reinterpret_cast<uint32_t*>(row_scales)[c0 / 128] = s.stored;
    }
  }
}

template <class T, Recipe R>
cudaError_t launch_quantize_rows(const T* src, int64_t ld, const int* gather, int rows,
                                 const int* rows_limit, int cols, uint8_t* out, uint8_t* scales,
                                 int num_sms, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  quantize_rows_kernel<T, R>
      <<<num_sms * 8, 256, 0, stream>>>(src, ld, gather, rows, rows_limit, cols, out, scales);
  return cudaGetLastError();
}

constexpr int kSegRows = 128, kSegCols = 64;

// Block (x: 128 padded positions, y: 64 columns). Threads first stage the tile as float32 in
// smem (row-major, one padding column), then thread (c = tid / 4, q = tid % 4) quantizes the 32
// positions 32q.. of column c and stores them as two 16-byte vectors.
template <class T, Recipe R>
__global__ void __launch_bounds__(256)
    quantize_segments_kernel(const T* __restrict__ src, int64_t ld, const int* gather,
                             const int* __restrict__ expert_offset,
                             const int* __restrict__ k_offset, int experts, int cols,
                             int64_t padded_rows, uint8_t* __restrict__ out,
                             uint8_t* __restrict__ scales) {
  __shared__ float tile[kSegRows][kSegCols + 1];
  __shared__ int64_t src_row[kSegRows];
  const int p0 = blockIdx.x * kSegRows, c0 = blockIdx.y * kSegCols, tid = threadIdx.x;
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
  constexpr int kVec = 16 / sizeof(T);      // elements per 16-byte load
  constexpr int kPerRow = kSegCols / kVec;  // loads per tile row
  for (int i = tid; i < kSegRows * kPerRow; i += 256) {
    const int r = i / kPerRow, v = i % kPerRow;
    float f[kVec];
    const int64_t row = src_row[r];
    if (row >= 0) {
      const uint4 raw = *reinterpret_cast<const uint4*>(src + row * ld + c0 + v * kVec);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < kVec; ++j) f[j] = to_float(e[j]);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) f[j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) tile[r][v * kVec + j] = f[j];
  }
  __syncthreads();
  const int c = tid >> 2, q = tid & 3;
  float m = 0.f;
#pragma unroll 8
  for (int j = 0; j < 32; ++j) m = amax_combine(m, tile[32 * q + j][c]);
  if constexpr (R == Recipe::kBlock) {
    m = amax_combine(m, __shfl_xor_sync(0xffffffffu, m, 1));  // the column's 4 threads
    m = amax_combine(m, __shfl_xor_sync(0xffffffffu, m, 2));
  }
  const BlockScale s = block_scale<R>(m);
  uint32_t words[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t lo =
        quantize_pair<R>(make_float2(tile[32 * q + 4 * j][c], tile[32 * q + 4 * j + 1][c]), s);
    const uint32_t hi =
        quantize_pair<R>(make_float2(tile[32 * q + 4 * j + 2][c], tile[32 * q + 4 * j + 3][c]), s);
    words[j] = lo | (hi << 16);
  }
  uint8_t* dst = out + static_cast<int64_t>(c0 + c) * padded_rows + p0 + 32 * q;
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(words[0], words[1], words[2], words[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(words[4], words[5], words[6], words[7]);
  uint8_t* col_scales = scales + static_cast<int64_t>(c0 + c) * (padded_rows / 32);
  if constexpr (R == Recipe::kMx) {
    col_scales[p0 / 32 + q] = static_cast<uint8_t>(s.stored);
  } else {
    if (q == 0) reinterpret_cast<uint32_t*>(col_scales)[p0 / 128] = s.stored;
  }
}

template <class T, Recipe R>
cudaError_t launch_quantize_segments(const T* src, int64_t ld, const int* gather,
                                     const int* expert_offset, const int* k_offset, int experts,
                                     int cols, int64_t padded_rows, uint8_t* out, uint8_t* scales,
                                     cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(padded_rows / kSegRows),
                  static_cast<unsigned>(cols / kSegCols));
  quantize_segments_kernel<T, R><<<grid, 256, 0, stream>>>(src, ld, gather, expert_offset, k_offset,
                                                           experts, cols, padded_rows, out, scales);
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
