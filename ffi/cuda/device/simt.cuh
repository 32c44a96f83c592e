// The SIMT grouped GEMM: the float32 path and the test oracle for the wgmma path (the call's
// attribute gemm = 1). Same tile schedule, same operand addressing, same accumulator layout and
// epilogues as mainloop_sm90.cuh; only the inner product runs on CUDA cores (f32 FMA, k in
// increasing order).
#pragma once

#include "cuda/device/epilogue.cuh"

namespace mok::cuda {

constexpr int kSimtBK = 16;
constexpr int kSimtThreads = 256;  // two "warpgroups" of 64 rows each

template <class T, Mode kMode, Epi kEpi>
__global__ void __launch_bounds__(kSimtThreads) simt_gemm_kernel(const GemmParams p) {
  constexpr int BM = kTileM, BN = kSimtBN, BK = kSimtBK;
  using Ops = Operands<T, kMode, BN>;
  __shared__ float As[BK][BM];      // (BK, BM)
  __shared__ float Bs[BK][BN];      // (BK, BN)
  extern __shared__ int s_route[];  // [2 * (E+1)]: mtile_prefix, expert_offset
  int* s_prefix = s_route;
  int* s_offset = s_route + p.experts + 1;
  for (int i = threadIdx.x; i <= p.experts; i += blockDim.x) {
    s_prefix[i] = p.mtile_prefix ? p.mtile_prefix[i] : 0;
    s_offset[i] = p.expert_offset[i];
  }
  __syncthreads();

  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  const int row_a = 64 * wg + frag_row(0, t);
  const int total = total_tiles<kMode>(p, s_prefix);
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const WorkTile w = decode_tile<kMode>(p, tile, s_prefix, s_offset);
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    for (int k0 = 0; k0 < w.k_len; k0 += BK) {
      for (int idx = threadIdx.x; idx < BM * BK; idx += blockDim.x) {
        int r, kk;
        const T* src;
        if constexpr (kMode == Mode::kRoutedK) {
          r = idx % BM, kk = idx / BM;
          src = Ops::a_wgrad(p, w.k_off, w.k_len, k0 + kk, w.row0 + r);
        } else {
          kk = idx % BK, r = idx / BK;
          src = Ops::a_routed(p, w.row0, w.rows, r, k0 + kk);
        }
        As[kk][r] = src ? to_float(*src) : 0.f;
      }
      for (int idx = threadIdx.x; idx < BN * BK; idx += blockDim.x) {
        int c, kk;
        const T* src;
        if constexpr (kMode == Mode::kRoutedK) {
          c = idx % BN, kk = idx / BN;
          src = Ops::b_wgrad(p, w.k_off, w.k_len, k0 + kk, w.n_tile * BN + c);
        } else if constexpr (kMode == Mode::kRoutedBN) {
          c = idx % BN, kk = idx / BN;
          src = Ops::b_routed(p, w.expert, w.n_tile, c, k0 + kk);
        } else {
          kk = idx % BK, c = idx / BK;
          src = Ops::b_routed(p, w.expert, w.n_tile, c, k0 + kk);
        }
        Bs[kk][c] = src ? to_float(*src) : 0.f;
      }
      __syncthreads();
#pragma unroll 4
      for (int kk = 0; kk < BK; ++kk) {
        const float a0 = As[kk][row_a], a1 = As[kk][row_a + 8];
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int c = 8 * j + 2 * (t & 3);
          const float b0 = Bs[kk][c], b1 = Bs[kk][c + 1];
          acc[4 * j + 0] = fmaf(a0, b0, acc[4 * j + 0]);
          acc[4 * j + 1] = fmaf(a0, b1, acc[4 * j + 1]);
          acc[4 * j + 2] = fmaf(a1, b0, acc[4 * j + 2]);
          acc[4 * j + 3] = fmaf(a1, b1, acc[4 * j + 3]);
        }
      }
      __syncthreads();
    }
    run_epilogue<T, kEpi, BN>(p, w, [&](int i) { return acc[i]; }, wg, t);
  }
}

template <class T, Mode kMode, Epi kEpi>
cudaError_t launch_simt_gemm(const GemmParams& p, int num_sms, cudaStream_t stream) {
  const size_t smem = sizeof(int) * 2 * (p.experts + 1);
  if (smem > 48 * 1024) {
    cudaError_t err =
        cudaFuncSetAttribute(simt_gemm_kernel<T, kMode, kEpi>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  simt_gemm_kernel<T, kMode, kEpi><<<num_sms * 4, kSimtThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mok::cuda
