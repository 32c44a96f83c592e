// The Hopper grouped GEMM (bf16 in, f32 accumulate): persistent, warp-specialized.
//   warpgroup 0      producer: cp.async gathers routed rows / weight tiles into a STAGES-deep
//                    ring of 128B-swizzled shared-memory tiles; arrival on `full[s]` is tied to
//                    the copies' completion (cp.async.mbarrier.arrive.noinc).
//   warpgroups 1, 2  consumers: wgmma 64×BN×16 each (CuTe SS atoms), then the fused epilogue
//                    straight from registers, while the producer already fills the next tile.
// Tile order, operand addressing and epilogues are shared with the SIMT oracle (simt.cuh).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "cuda/epilogue.cuh"

namespace mok::cuda {

template <Mode kMode>
struct WgmmaConfig {
  static constexpr int BM = kTileM, BN = 128, BK = 64, kStages = 5;
  static constexpr int kThreads = 384;
  using Elem = cute::bfloat16_t;
  static constexpr auto kMajorA = kMode == Mode::kRoutedK ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  static constexpr auto kMajorB = kMode == Mode::kRoutedBK ? cute::GMMA::Major::K : cute::GMMA::Major::MN;
  template <cute::GMMA::Major kMajor>
  using Atom = std::conditional_t<kMajor == cute::GMMA::Major::K, cute::GMMA::Layout_K_SW128_Atom<Elem>,
                                  cute::GMMA::Layout_MN_SW128_Atom<Elem>>;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      Atom<kMajorA>{}, cute::Shape<cute::Int<BM>, cute::Int<BK>, cute::Int<kStages>>{}));  // (BM,BK,STAGES)
  using SmemLayoutB = decltype(cute::tile_to_shape(
      Atom<kMajorB>{}, cute::Shape<cute::Int<BN>, cute::Int<BK>, cute::Int<kStages>>{}));  // (BN,BK,STAGES)
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<kMajorA, kMajorB>{},
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));  // 2 warpgroups along M
  static constexpr int kStageBytesA = BM * BK * 2, kStageBytesB = BN * BK * 2;
  static constexpr int kRingBytes = kStages * (kStageBytesA + kStageBytesB);
  static size_t smem_bytes(int experts) {
    return 1024 + kRingBytes + 2 * kStages * sizeof(uint64_t) + 2 * sizeof(int) * (experts + 1);
  }
};

// One stage: 1024 16-byte chunks per operand, 8 per producer thread.
template <Mode kMode>
__device__ __forceinline__ void produce_stage(const GemmParams& p, const WorkTile& w, int k0,
                                              int stage, uint32_t sa, uint32_t sb, int tid) {
  using Cfg = WgmmaConfig<kMode>;
  using Ops = Operands<bf16, kMode, Cfg::BN>;
  constexpr typename Cfg::SmemLayoutA layout_a{};
  constexpr typename Cfg::SmemLayoutB layout_b{};
  const bf16* dummy = static_cast<const bf16*>(p.b);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int idx = tid + 128 * i;
    if constexpr (kMode == Mode::kRoutedK) {
      const int kr = idx >> 4, c = (idx & 15) * 8;  // k-row, 8 contiguous m / n
      const bf16* a = Ops::a_wgrad(p, w.k_off, w.k_len, k0 + kr, w.row0 + c);
      const bf16* b = Ops::b_wgrad(p, w.k_off, w.k_len, k0 + kr, w.n_tile * Cfg::BN + c);
      cp_async_16(sa + 2 * layout_a(c, kr, stage), a ? a : dummy, a != nullptr);
      cp_async_16(sb + 2 * layout_b(c, kr, stage), b ? b : dummy, b != nullptr);
    } else {
      const int r = idx >> 3, kc = (idx & 7) * 8;  // A: m-row, 8 contiguous k
      const bf16* a = Ops::a_routed(p, w.row0, w.rows, r, k0 + kc);
      cp_async_16(sa + 2 * layout_a(r, kc, stage), a ? a : dummy, a != nullptr);
      if constexpr (kMode == Mode::kRoutedBN) {
        const int kr = idx >> 4, c = (idx & 15) * 8;  // B: k-row, 8 contiguous n
        const bf16* b = Ops::b_routed(p, w.expert, w.n_tile, c, k0 + kr);
        cp_async_16(sb + 2 * layout_b(c, kr, stage), b ? b : dummy, b != nullptr);
      } else {
        const bf16* b = Ops::b_routed(p, w.expert, w.n_tile, r, k0 + kc);  // B: n-row, 8 k
        cp_async_16(sb + 2 * layout_b(r, kc, stage), b ? b : dummy, b != nullptr);
      }
    }
  }
}

template <Mode kMode, Epi kEpi>
__global__ void __launch_bounds__(384, 1) wgmma_gemm_kernel(const __grid_constant__ GemmParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Cfg = WgmmaConfig<kMode>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kStages = Cfg::kStages;
  extern __shared__ char smem_raw[];
  char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  auto* ring_a = reinterpret_cast<typename Cfg::Elem*>(smem);
  auto* ring_b = reinterpret_cast<typename Cfg::Elem*>(smem + kStages * Cfg::kStageBytesA);
  auto* full = reinterpret_cast<uint64_t*>(smem + Cfg::kRingBytes);
  uint64_t* empty = full + kStages;
  int* s_prefix = reinterpret_cast<int*>(empty + kStages);  // [E+1]
  int* s_offset = s_prefix + p.experts + 1;                 // [E+1]

  for (int i = threadIdx.x; i <= p.experts; i += blockDim.x) {
    s_prefix[i] = p.mtile_prefix ? p.mtile_prefix[i] : 0;
    s_offset[i] = p.expert_offset[i];
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 128);  // every producer thread arrives once its copies land
      mbar_init(&empty[s], 2);   // one thread per consumer warpgroup
    }
  }
  __syncthreads();

  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  const int total = total_tiles<kMode>(p, s_prefix);
  if (wg == 0) {
    const uint32_t sa = smem_u32(ring_a), sb = smem_u32(ring_b);
    int stage = 0, phase = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
      const WorkTile w = decode_tile<kMode>(p, tile, s_prefix, s_offset);
      for (int k0 = 0; k0 < w.k_len; k0 += BK) {
        mbar_wait(&empty[stage], phase ^ 1);
        produce_stage<kMode>(p, w, k0, stage, sa, sb, t);
        mbar_arrive_cp_async(&full[stage]);
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
  } else {
    Tensor sA = make_tensor(make_smem_ptr(ring_a), typename Cfg::SmemLayoutA{});  // (BM,BK,STAGES)
    Tensor sB = make_tensor(make_smem_ptr(ring_b), typename Cfg::SmemLayoutB{});  // (BN,BK,STAGES)
    typename Cfg::TiledMma mma;
    mma.accumulate_ = GMMA::ScaleOut::One;
    auto thr = mma.get_thread_slice(threadIdx.x - 128);
    Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA,MMA_M,MMA_K,STAGES) descriptors
    Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));  // (MMA,MMA_N,MMA_K,STAGES)
    Tensor acc = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});  // (MMA,MMA_M,MMA_N) f32
    int stage = 0, phase = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
      const WorkTile w = decode_tile<kMode>(p, tile, s_prefix, s_offset);
      clear(acc);
      int prev = -1;
      for (int k0 = 0; k0 < w.k_len; k0 += BK) {
        mbar_wait(&full[stage], phase);
        fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads async
        warpgroup_fence_operand(acc);
        warpgroup_arrive();
        gemm(mma, tCrA(_, _, _, stage), tCrB(_, _, _, stage), acc);
        warpgroup_commit_batch();
        warpgroup_wait<1>();  // the previous stage's wgmma is done: hand its buffers back
        warpgroup_fence_operand(acc);
        if (prev >= 0 && t == 0) mbar_arrive(&empty[prev]);
        prev = stage;
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
      warpgroup_wait<0>();
      if (prev >= 0 && t == 0) mbar_arrive(&empty[prev]);
      run_epilogue<bf16, kEpi, BN>(p, w, [&](int i) { return acc(i); }, wg - 1, t);
    }
  }
#endif
}

template <Mode kMode, Epi kEpi>
cudaError_t launch_wgmma_gemm(const GemmParams& p, int num_sms, cudaStream_t stream) {
  using Cfg = WgmmaConfig<kMode>;
  const size_t smem = Cfg::smem_bytes(p.experts);
  cudaError_t err = cudaFuncSetAttribute(wgmma_gemm_kernel<kMode, kEpi>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  wgmma_gemm_kernel<kMode, kEpi><<<num_sms, Cfg::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mok::cuda
