// Experiment JAX_MOK_FP8_IND_TILES (CMake, off by default, until its GPU A/B): the fp8_block
// routed-M GEMMs whose epilogue is a plain row store (down: kWeighted; dh Wgu^T: kStoreRows) with
// each consumer warpgroup on its own tile, so that one warpgroup's epilogue runs while the other's
// wgmmas keep the tensor pipe busy.
//
// In fp8_gemm_kernel both consumer warpgroups share every stage of one ring (64 rows each of a
// 128 x 256 tile), so they finish a tile together and both store while the tensor pipe idles;
// offsetting them on the shared ring (r33's start skew) only took the leader's lookahead away.
// Here the work unit is a half tile: 128 rows x 128 columns (columns 128 h .. 128 h + 127 of the
// schedule's 256-wide n-tile; half-tile id 2 * tile + h). Each consumer warpgroup has its own ring
// of kIndStages stages (A 128 x 128, B 128 x 128) fed by its own half of the producer warpgroup
// (warps 0-1 for consumer 0, warps 2-3 for consumer 1), its own tile ring and its own slice of the
// staging area: no barrier, stage or buffer is shared between the two streams.
//
// Per k32 step a warpgroup issues the m64n128k32 wgmmas of its two 64-row halves; fp8_block's
// promotion (one scale block per 128-K stage) adds each half's fresh tile `part` into its
// accumulators (acc[i + 64 m]: rows 64 m .. 64 m + 63, the wgmma order of a 64 x 128 tile) —
// the same per-element arithmetic, in the same order, as fp8_gemm_kernel's, so the outputs are
// bitwise equal. Costs: each A row block is loaded once per half tile, i.e. twice per 256-wide
// tile (1.33x the L2 bytes per FLOP), and 192 of the 224 consumer registers hold accumulators.
#pragma once

#include "cuda/device/fp8_gemm.cuh"

namespace mok::cuda::fp8 {

constexpr int kIndStages = 3;  // per consumer warpgroup: 6 x 32 KB in all

struct alignas(1024) IndSmem {
  uint8_t a[2][kIndStages][kBM * kBK];     // [stream][stage] (128, 128), 128B-swizzled rows
  uint8_t b[2][kIndStages][kHalfN * kBK];  // [stream][stage] (128, 128): two TMA boxes
  uint32_t sa[2][kIndStages][kBM];         // A scales (float32 bits) per tile row
  uint32_t sb[2][kIndStages];              // the half's B scale (fp8_block: per 128 B rows)
  uint64_t full[2][kIndStages], empty[2][kIndStages];
  TileRing tiles[2];                            // dynamic order: each stream's ids
  int64_t rows[2][kBM];                         // source row of each tile row (-1: none)
  alignas(128) char out_stage[kOutStageBytes];  // 8 KB per consumer warpgroup
};
constexpr size_t ind_smem_bytes(int64_t experts) {
  return 1024 + sizeof(IndSmem) + 2 * sizeof(int) * static_cast<size_t>(experts + 1);
}
// `full`: each of the stream's 64 producer threads (cp.async arrival) and the TMA thread.
constexpr int kIndFullArrivals = 64 + 1;

// Named barriers 5 and 6: the 64 producer threads of stream s.
__device__ __forceinline__ void stream_sync(int s) {
  asm volatile("bar.sync %0, 64;\n" ::"r"(5 + s) : "memory");
}

// The producer of stream s (u: 0..63). Its A copies: rows (u >> 2) + 16 i (i < 8), 16-byte chunks
// 2 (u & 3) and 2 (u & 3) + 1 of each, at (u >> 2) * 128 + 2048 i + the swizzled chunk in a stage
// (every row of a thread shares the swizzle phase (u >> 2) & 7): 8 row pointers a thread, as many
// as fp8_producer keeps (16 spilled the producer's 56 registers).
template <Epi8 kEpi>
__device__ void ind_producer(const Fp8GemmParams& p, IndSmem& s, const int* s_prefix,
                             const int* s_offset, int st, int u) {
  const int total = 2 * total_tiles<Mode::kRoutedBN>(p, s_prefix);
  const int chunk = 2 * (u & 3), swz = (u >> 2) & 7;
  const uint32_t dst0 = (u >> 2) * 128 + ((chunk ^ swz) << 4);  // chunk + 1: dst0 ^ 16
  const bool dynamic = p.epi.tile_counter != nullptr;
  TileRing& ring = s.tiles[st];
  PipelineState<kTileRing> walk;
  int stage = 0, phase = 0;
  for (int it = 0;; ++it) {
    int id;
    if (dynamic) {
      if (u == 0) take_tile(ring, walk, p.epi.tile_counter, total);
      stream_sync(st);
      id = *reinterpret_cast<volatile int*>(&ring.current);
    } else {
      id = 2 * static_cast<int>(blockIdx.x + it * gridDim.x) + st;
    }
    if (id < 0 || id >= total) break;
    const int half = id & 1;
    const WorkTile w = decode_tile<Mode::kRoutedBN>(p, id >> 1, s_prefix, s_offset);
    stream_sync(st);  // the previous tile's rows are no longer read
    // Scale rows as 32-bit byte offsets from p.a_scale (-1: none; the scales of a row are K / 32
    // bytes, so any FP8 operand's scales fit), to keep the producer in its 56 registers.
    int a_scale_off[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = u + 64 * j;
      int64_t src = -1;
      if (r < w.rows) src = p.a_gather ? p.a_gather[w.row0 + r] : w.row0 + r;
      a_scale_off[j] = src >= 0 ? static_cast<int>(src * p.a_scale_ld) : -1;
      s.rows[st][r] = src;
    }
    stream_sync(st);
    const uint8_t* a_src[8];  // the first chunk's sources at K = 0 (nullptr: no row)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t src = s.rows[st][(u >> 2) + 16 * i];
      a_src[i] = src >= 0 ? p.a + src * p.lda + 16 * chunk : nullptr;
    }
    const int e = w.expert;
    const int n_half = fp8_box_row(p, w.n_tile, 2 * half);  // the half's first B row
    const int64_t b_scale_off =                             // -1: past b_rows (zero fill)
        n_half < p.b_rows ? e * p.b_scale_expert_stride + (n_half / 128) * p.b_scale_ld : -1;
    for (int k0 = 0; k0 < w.k_len; k0 += kBK) {
      mbar_wait(&s.empty[st][stage], phase ^ 1);
      const int k = w.k_off + k0;
      const uint32_t stage_a = smem_u32(s.a[st][stage]);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const bool ok = a_src[i] != nullptr;
        cp_async_16(stage_a + dst0 + 2048 * i, ok ? a_src[i] + k : p.a, ok);
        cp_async_16((stage_a + dst0 + 2048 * i) ^ 16u, ok ? a_src[i] + k + 16 : p.a, ok);
      }
      if (u == 0) {
        mbar_arrive_expect_tx(&s.full[st][stage], kHalfN * kBK);
#pragma unroll
        for (int j = 0; j < 2; ++j)
          tma_load_3d(smem_u32(s.b[st][stage]) + j * kBoxRows * kBK, &p.tmap_b, &s.full[st][stage],
                      k, fp8_box_row(p, w.n_tile, 2 * half + j), e);
      }
      const int kw = k / kBK * kScaleBytesPerK128;
#pragma unroll
      for (int j = 0; j < 2; ++j)
        cp_async_4(smem_u32(&s.sa[st][stage][u + 64 * j]),
                   p.a_scale + (a_scale_off[j] >= 0 ? a_scale_off[j] + kw : 0),
                   a_scale_off[j] >= 0);
      if (u == 1)
        cp_async_4(smem_u32(&s.sb[st][stage]),
                   p.b_scale + (b_scale_off >= 0 ? b_scale_off + kw : 0), b_scale_off >= 0);
      mbar_arrive_cp_async(&s.full[st][stage]);
      if (++stage == kIndStages) stage = 0, phase ^= 1;
    }
  }
}

template <Epi8 kEpi, class T>
__device__ void ind_consumer(const Fp8GemmParams& p, IndSmem& s, const int* s_prefix,
                             const int* s_offset, int c, int t) {
  using namespace cute;
  using Elem = cute::float_e4m3_t;
  using SmemLayout = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                            Shape<Int<kBM>, Int<kBK>, Int<kIndStages>>{}));
  // Two warpgroups' worth of rows along M: slice m of the tiled MMA is the 64-row half m, both
  // issued by this warpgroup (get_thread_slice(128 m + t)).
  using TiledMma = decltype(make_tiled_mma(SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>{},
                                           Layout<Shape<_2, _1, _1>>{}));
  static_assert(sizeof(s.a[0]) == cosize(SmemLayout{}), "A ring size");
  static_assert(sizeof(s.b[0]) == cosize(SmemLayout{}), "B ring size");
  Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<Elem*>(&s.a[c][0][0])), SmemLayout{});
  Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<Elem*>(&s.b[c][0][0])), SmemLayout{});
  TiledMma mma;
  auto thr0 = mma.get_thread_slice(t);
  auto thr1 = mma.get_thread_slice(128 + t);
  Tensor tA0 = thr0.make_fragment_A(thr0.partition_A(sA));  // (MMA,1,MMA_K,STAGES)
  Tensor tA1 = thr1.make_fragment_A(thr1.partition_A(sA));
  Tensor tB0 = thr0.make_fragment_B(thr0.partition_B(sB));
  Tensor tB1 = thr1.make_fragment_B(thr1.partition_B(sB));
  Tensor part = partition_fragment_C(mma, Shape<Int<kBM>, Int<kHalfN>>{});  // (MMA,1,1) 64 f32
  static_assert(decltype(size(part))::value == 64, "64 accumulators per thread and half");
  float acc[128];  // value i + 64 m: rows 64 m .., in the wgmma order of a 64 x 128 tile
  const int total = 2 * total_tiles<Mode::kRoutedBN>(p, s_prefix);
  const bool dynamic = p.epi.tile_counter != nullptr;
  PipelineState<kTileRing> walk;
  int stage = 0, phase = 0;
  for (int it = 0;; ++it) {
    const int id = dynamic ? next_tile(s.tiles[c], walk)
                           : 2 * static_cast<int>(blockIdx.x + it * gridDim.x) + c;
    if (id < 0 || id >= total) break;
    WorkTile w = decode_tile<Mode::kRoutedBN>(p, id >> 1, s_prefix, s_offset);
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    for (int k0 = 0; k0 < w.k_len; k0 += kBK) {
      mbar_wait(&s.full[c][stage], phase);
      fence_proxy_async();  // cp.async wrote A through the generic proxy; wgmma reads async
      const float b = __uint_as_float(s.sb[c][stage]);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        if (64 * m >= w.rows) continue;  // no row of this half (uniform): zeros stay zero
        // One promotion group (the stage's 4 k32 steps) per wgmma batch, as fp8_gemm_kernel.
        mma.accumulate_ = GMMA::ScaleOut::Zero;
        warpgroup_fence_operand(part);
        warpgroup_arrive();
#pragma unroll
        for (int j = 0; j < kSteps; ++j) {
          if (m == 0)
            gemm(mma, tA0(_, _, j, stage), tB0(_, _, j, stage), part);
          else
            gemm(mma, tA1(_, _, j, stage), tB1(_, _, j, stage), part);
          mma.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(part);
        const float f0 = __uint_as_float(s.sa[c][stage][64 * m + frag_row(0, t)]) * b;
        const float f1 = __uint_as_float(s.sa[c][stage][64 * m + frag_row(2, t)]) * b;
#pragma unroll
        for (int i = 0; i < 64; ++i)
          acc[i + 64 * m] = fmaf(part(i), ((i >> 1) & 1) ? f1 : f0, acc[i + 64 * m]);
      }
      if (t == 0) mbar_arrive(&s.empty[c][stage]);
      if (++stage == kIndStages) stage = 0, phase ^= 1;
    }
    w.n_tile = 2 * w.n_tile + (id & 1);  // the half tile's 128 columns (BN = 128 below)
    constexpr Epi kBf16Epi = kEpi == Epi8::kWeighted ? Epi::kWeighted : Epi::kStoreRows;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      if (64 * m >= w.rows) continue;
      auto value = [&](int i) { return acc[i + 64 * m]; };
      if constexpr (std::is_same_v<T, bf16>) {
        if (p.staged_out) {
          store_rows_staged<kBf16Epi, kHalfN, false>(
              p.epi, w, value, m, t, smem_u32(s.out_stage) + c * (kOutStageBytes / 2), c);
          continue;
        }
      }
      run_epilogue<T, kBf16Epi, kHalfN>(p.epi, w, value, m, t);
    }
  }
}

template <Epi8 kEpi, class T>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_ind_gemm_kernel(const __grid_constant__ Fp8GemmParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  IndSmem& s = *reinterpret_cast<IndSmem*>(base);
  int* s_prefix = reinterpret_cast<int*>(base + sizeof(IndSmem));  // mtile_prefix
  int* s_offset = s_prefix + p.experts + 1;                        // expert_offset
  for (int i = threadIdx.x; i <= p.experts; i += blockDim.x) {
    s_prefix[i] = p.mtile_prefix[i];
    s_offset[i] = p.expert_offset[i];
  }
  if (threadIdx.x == 0) {
    for (int c = 0; c < 2; ++c) {
      for (int i = 0; i < kIndStages; ++i) {
        mbar_init(&s.full[c][i], kIndFullArrivals);
        mbar_init(&s.empty[c][i], 1);  // the stream's consumer warpgroup, one thread
      }
      for (int i = 0; i < kTileRing; ++i) {
        mbar_init(&s.tiles[c].full[i], 1);     // the stream's first producer thread
        mbar_init(&s.tiles[c].empty[i], 128);  // every thread of the stream's consumer
      }
    }
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
    if (t == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.tmap_b) : "memory");
    ind_producer<kEpi>(p, s, s_prefix, s_offset, t >> 6, t & 63);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    ind_consumer<kEpi, T>(p, s, s_prefix, s_offset, wg - 1, t);
  }
#endif
}

// Whether launch_fp8_gemm takes this kernel: the option is on, the GEMM is an fp8_block routed-M
// one with a plain row-store epilogue, and the expert tables fit beside the rings.
template <Recipe R, TileShape kShape, bool kBPerRow, Epi8 kEpi>
constexpr bool kIndTiles =
    JAX_MOK_FP8_IND_TILES != 0 && R == Recipe::kBlock && kShape == TileShape::kRoutedM &&
    !kBPerRow && (kEpi == Epi8::kWeighted || kEpi == Epi8::kStoreRows);

template <Epi8 kEpi, class T>
cudaError_t launch_fp8_ind(const Fp8GemmParams& p, int num_sms, cudaStream_t stream) {
  const size_t smem = ind_smem_bytes(p.experts);
  auto* kernel = fp8_ind_gemm_kernel<kEpi, T>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<num_sms, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mok::cuda::fp8
