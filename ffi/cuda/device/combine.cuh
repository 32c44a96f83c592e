// Phase "combine": per-token sums over the k assignments in the order j = 0..k-1, in float32,
// cast once — bitwise deterministic by construction (no atomics). The per-assignment rows come in
// x's dtype (the GEMM epilogue rounds each once, as a PyTorch grouped_mm + index_add_ does).
#pragma once

#include "cuda/device/ptx.cuh"
#include "cuda/device/route.cuh"

namespace mok::cuda {

// out[t, :] = Σ_j parts[assign_pos[t, j], :]   parts: [P, H] T, out: [T, H] T
template <class T>
__global__ void combine_rows_kernel(const T* __restrict__ parts, const int* __restrict__ assign_pos,
                                    T* __restrict__ out, int tokens, int top_k, int hidden) {
  const int quads = hidden / 4;
  for (int token = blockIdx.x; token < tokens; token += gridDim.x) {
    for (int q = threadIdx.x; q < quads; q += blockDim.x) {
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int j = 0; j < top_k; ++j) {
        const int pos = assign_pos[token * top_k + j];
        if (pos < 0) continue;
        const float4 v = load4(parts + (int64_t)pos * hidden + 4 * q);
        sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
      }
      T* dst = out + (int64_t)token * hidden + 4 * q;
      store2(dst, sum.x, sum.y);
      store2(dst + 2, sum.z, sum.w);
    }
  }
}

// d_w[t, j] = Σ_n dw_part[pos, n] over the n-tiles in order; 0 for skipped assignments.
static __global__ void reduce_dw_kernel(const float* __restrict__ dw_part,
                                        const int* __restrict__ assign_pos, float* __restrict__ d_w,
                                        int assignments, int n_tiles) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= assignments) return;
  const int pos = assign_pos[idx];
  float s = 0.f;
  if (pos >= 0)
    for (int n = 0; n < n_tiles; ++n) s += dw_part[(int64_t)pos * n_tiles + n];
  d_w[idx] = s;
}

// The inverse direction, for the backward's weight-gradient GEMMs: token rows into expert order,
// out[assign_pos[t, j], :] = src[t, :] for every routed assignment (assign_pos >= 0; rows of
// unrouted positions are left as they are: the routed-K mainloop zeroes every row past an
// expert's count). A warp per token row, which it reads once and stores k times: gathering by
// position instead reads each row k times in expert order, every expert's positions walking all
// of src, so where src outgrows the L2 (S2's x and dy: 117 MB each) most of those reads come from
// DRAM. Lane l holds the 16-byte vectors l, l + 32, ..., kCopyUnroll loads in flight before the
// first store (a memory-bound copy needs ~30 KB in flight per SM). H is a multiple of 8 (checked
// by the handlers): whole vectors. Two matrices (x and dy) in one launch: rows 0..T-1 of src0,
// then T..2T-1 of src1.
constexpr int kCopyUnroll = 4;

template <class T>
__global__ void __launch_bounds__(256)
    scatter_rows_kernel(const T* __restrict__ src0, T* __restrict__ out0,
                        const T* __restrict__ src1, T* __restrict__ out1,
                        const int* __restrict__ assign_pos, int tokens, int top_k, int hidden) {
  const int vecs = hidden * static_cast<int>(sizeof(T)) / 16;
  const int lane = threadIdx.x & 31;
  const int warps = gridDim.x * (blockDim.x >> 5);
  const int rows = src1 ? 2 * tokens : tokens;
  for (int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
    const bool second = row >= tokens;
    const int t = second ? row - tokens : row;
    const uint4* from =
        reinterpret_cast<const uint4*>((second ? src1 : src0) + static_cast<int64_t>(t) * hidden);
    T* out = second ? out1 : out0;
    const int* pos_of = assign_pos + static_cast<int64_t>(t) * top_k;
    for (int v0 = lane; v0 < vecs; v0 += 32 * kCopyUnroll) {
      uint4 r[kCopyUnroll];
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u)
        if (v0 + 32 * u < vecs) r[u] = __ldcs(from + v0 + 32 * u);  // read once: evict first
      for (int j = 0; j < top_k; ++j) {
        const int pos = __ldg(pos_of + j);  // the same word for the whole warp
        if (pos < 0) continue;
        uint4* to = reinterpret_cast<uint4*>(out + static_cast<int64_t>(pos) * hidden);
#pragma unroll
        for (int u = 0; u < kCopyUnroll; ++u)
          if (v0 + 32 * u < vecs) to[v0 + 32 * u] = r[u];
      }
    }
  }
}

// Token rows into expert order: out0[p] = src0[sorted_token[p]] (and out1 from src1 where given)
// for the routed positions p < expert_offset[E]; later rows are left as they are.
template <class T>
cudaError_t launch_to_expert_order(const Routing& r, const T* src0, T* out0, const T* src1, T* out1,
                                   int hidden, int num_sms, cudaStream_t stream) {
  scatter_rows_kernel<T><<<num_sms * 8, 256, 0, stream>>>(src0, out0, src1, out1, r.assign_pos,
                                                          r.assignments / r.top_k, r.top_k, hidden);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_combine(const T* parts, const int* assign_pos, T* out, int tokens, int top_k,
                           int hidden, int num_sms, cudaStream_t stream) {
  const int blocks = tokens < num_sms * 8 ? tokens : num_sms * 8;
  combine_rows_kernel<T><<<blocks, 256, 0, stream>>>(parts, assign_pos, out, tokens, top_k, hidden);
  return cudaGetLastError();
}

}  // namespace mok::cuda
