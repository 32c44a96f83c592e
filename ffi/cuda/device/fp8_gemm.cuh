// The Hopper FP8 grouped GEMM of both recipes (fp8_format.cuh): E4M3 operands, float32
// accumulation, block scales applied in float32 by the CUDA cores ("promotion").
//
//   CTA tile 64 (M) x 256 (N) x 128 (K per stage); warpgroup 0 produces, warpgroups 1 and 2
//   consume, each owning 128 of the 256 columns (wgmma m64n128k32, both operands K-major as FP8
//   wgmma requires). A scale block covers 128 K (fp8_block) or 32 K (mxfp8): the wgmmas of one
//   scale block accumulate into a fresh register tile `part`, which is then added to the float32
//   accumulator times (scale of the A row) x (scale of the B column). FP8 wgmma accumulates with
//   limited precision, so no more than one scale block ever sums inside the tensor cores.
//
//   Operand A: rows of an FP8 matrix, K contiguous, gathered (routed rows) or not, by cp.async
//   into 128B-swizzled smem; its scales, 4 bytes per row per stage, by plain loads converted to
//   float32 in smem. Operand B: the experts' FP8 weights [E][N][K] (or one [N][K] matrix) by TMA,
//   four 64-row boxes per stage; scales per B row (mxfp8, and the weight gradients' token-wise
//   scales) or per 128-row block (fp8_block weights).
//
//   Two tile shapes:
//   kRoutedM  rows = expert-sorted positions (64-row tiles of one expert), B = that expert's
//             weights, K = the full reduction dim. Epilogues as the BF16 path (epilogue.cuh),
//             plus kGluQuant: SwiGLU whose activations are quantized along F right here (a 1x128
//             block spans both consumer warpgroups, which exchange their row maxima in smem).
//   kExpertK  weight gradients: C_e[m, n] = sum_p A[m, p] B[n, p] over the positions p of expert
//             e, both operands transposed and quantized along positions (quantize.cuh), each
//             expert's positions padded to a multiple of 128 (k_offset).
#pragma once

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cuda/device/fp8_format.cuh"
#include "cuda/epilogue.cuh"
#include "cuda/mainloop.cuh"  // producer_sync, consumer_sync

namespace mok::cuda::fp8 {

constexpr int kBM = 64, kBN = 256, kBK = 128, kStages = 4, kThreads = 384;
constexpr int kWgN = kBN / 2;     // columns per consumer warpgroup
constexpr int kSteps = kBK / 32;  // k32 wgmma steps per stage
constexpr int kBoxRows = 64;      // rows of one TMA box of B (128 bytes wide)

enum class TileShape { kRoutedM, kExpertK };
// kGluQuant: SwiGLU of the gate/up tile, quantized to FP8 (+ h saved when epi.out2 is set).
// Otherwise one of the BF16 path's epilogues, run per consumer warpgroup.
enum class Epi8 { kGluQuant, kWeighted, kSwiGLUBwd, kStoreRows, kStoreGLU, kStoreCast };

struct Fp8GemmParams {
  // schedule (device arrays)
  const int* expert_offset;  // [E+1] first position of each expert
  const int* tile_prefix;    // [E+1] kRoutedM: exclusive prefix of ceil(count / 64)
  const int* k_offset;       // [E+1] kExpertK: first padded position of each expert
  int experts;
  int M, N, K;  // kRoutedM: N, K (M is the positions); kExpertK: M, N (K per expert)
  int b_rows;   // rows of B per expert (N, or 2F for gate/up tiles): TMA and scale bounds
  int n_tiles;  // 256-wide tiles along N (kRoutedM with glu: 128 F columns each)
  int m_tiles;  // kExpertK: 64-row tiles along M
  bool glu;     // B rows = [gate | up], glu_offset = F
  int glu_offset;
  // A: FP8 [rows][lda] (K contiguous); scales: K / 32 bytes per row (4 bytes per 128 K)
  const uint8_t* a;
  int64_t lda;
  const int* a_gather;  // kRoutedM: row of position p is a_gather[p] (nullptr: p)
  const uint8_t* a_scale;
  int64_t a_scale_ld;  // bytes per row of scales
  // B: FP8 by TMA (tmap_b: [E][N][K], boxes 128 x 64); scales
  const uint8_t* b_scale;
  int64_t b_scale_expert_stride;  // bytes per expert
  int64_t b_scale_ld;             // bytes per scale row (per B row, or per 128 B rows)
  // kGluQuant outputs: a = SwiGLU(h) as FP8 [P][F] and its scales (F / 32 bytes per row)
  uint8_t* q_out;
  uint8_t* q_scale;
  GemmParams epi;  // the BF16 path's epilogue fields (out, out2, h, topk_weights, sorted_slot, ...)
  alignas(64) CUtensorMap tmap_b;
};

struct Fp8Tile {
  int expert, row0, rows, n_tile, k_off, k_len;
};

// Largest e with prefix[e] * n_tiles <= tile; tiles of one expert are n-tile major.
__device__ __forceinline__ Fp8Tile decode_routed64(int tile, const int* prefix, const int* offset,
                                                   int experts, int n_tiles, int K) {
  int lo = 0, hi = experts;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (prefix[mid] * n_tiles <= tile)
      lo = mid;
    else
      hi = mid;
  }
  const int m_tiles = prefix[lo + 1] - prefix[lo];
  const int local = tile - prefix[lo] * n_tiles;
  Fp8Tile w;
  w.expert = lo;
  w.n_tile = local / m_tiles;
  w.row0 = offset[lo] + (local - w.n_tile * m_tiles) * kBM;
  w.rows = min(kBM, offset[lo + 1] - w.row0);
  w.k_off = 0;
  w.k_len = K;
  return w;
}

template <TileShape kShape>
__device__ __forceinline__ int fp8_total_tiles(const Fp8GemmParams& p, const int* s_prefix) {
  if constexpr (kShape == TileShape::kExpertK)
    return p.experts * p.m_tiles * p.n_tiles;
  else
    return s_prefix[p.experts] * p.n_tiles;
}

template <TileShape kShape>
__device__ __forceinline__ Fp8Tile fp8_decode(const Fp8GemmParams& p, int tile, const int* s_prefix,
                                              const int* s_offset) {
  if constexpr (kShape == TileShape::kExpertK) {
    const int per_expert = p.m_tiles * p.n_tiles;
    Fp8Tile w;
    w.expert = tile / per_expert;
    const int local = tile - w.expert * per_expert;
    w.n_tile = local / p.m_tiles;
    w.row0 = (local - w.n_tile * p.m_tiles) * kBM;
    w.rows = min(kBM, p.M - w.row0);
    w.k_off = s_offset[w.expert];
    w.k_len = s_offset[w.expert + 1] - w.k_off;
    return w;
  } else {
    return decode_routed64(tile, s_prefix, s_offset, p.experts, p.n_tiles, p.K);
  }
}

// First B row of box j (0..3) of a tile: gate/up tiles are [gate f0.. | up f0.. | gate f0+64.. |
// up f0+64..] so that each consumer warpgroup holds the gate and up columns of its 64 F columns.
__device__ __forceinline__ int fp8_box_row(const Fp8GemmParams& p, int n_tile, int j) {
  if (p.glu) {
    const int f = n_tile * (kBN / 2) + (j >> 1) * kBoxRows;
    return (j & 1) ? p.glu_offset + f : f;
  }
  return n_tile * kBN + j * kBoxRows;
}

struct alignas(1024) Fp8Smem {
  uint8_t a[kStages][kBM * kBK];   // (64, 128) per stage, 128B-swizzled rows
  uint8_t b[kStages][kBN * kBK];   // (256, 128) per stage, four TMA boxes
  float sa[kStages][kSteps][kBM];  // A scales of each k32 step (fp8_block: step 0 only)
  float sb[kStages][kSteps][kBN];  // B scales per B row, or per box in [.][0][0..3]
  uint64_t full[kStages], empty[kStages];
  int64_t rows[kBM];      // source row of each tile row (-1: none)
  float xchg[2][2][kBM];  // kGluQuant, fp8_block: row maxima of each warpgroup
};
// The expert tables follow the struct: tile_prefix / k_offset [E+1], expert_offset [E+1].
inline size_t fp8_smem_bytes(int experts) {
  return 1024 + sizeof(Fp8Smem) + 2 * sizeof(int) * static_cast<size_t>(experts + 1);
}

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

template <Recipe R, TileShape kShape, bool kBPerRow>
__device__ void fp8_producer(const Fp8GemmParams& p, Fp8Smem& s, const int* s_prefix,
                             const int* s_offset, int t) {
  const int total = fp8_total_tiles<kShape>(p, s_prefix);
  const int chunk = t & 7;  // this thread's 16-byte chunk of every A row it copies
  int stage = 0, phase = 0;
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const Fp8Tile w = fp8_decode<kShape>(p, tile, s_prefix, s_offset);
    producer_sync();  // the previous tile's rows are no longer read
    if (t < kBM) {
      int64_t src = -1;
      if (t < w.rows) {
        const int pos = w.row0 + t;
        src = (kShape == TileShape::kRoutedM && p.a_gather) ? p.a_gather[pos] : pos;
      }
      s.rows[t] = src;
    }
    producer_sync();
    for (int k0 = 0; k0 < w.k_len; k0 += kBK) {
      mbar_wait(&s.empty[stage], phase ^ 1);
      const int k = w.k_off + k0;  // absolute K of the stage in A and B
      const uint32_t stage_a = smem_u32(s.a[stage]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // A: 64 rows x 8 chunks of 16 bytes
        const int r = (t >> 3) + 16 * i;
        const int64_t src = s.rows[r];
        const bool ok = src >= 0;
        cp_async_16(stage_a + r * 128 + ((chunk ^ (r & 7)) << 4),
                    ok ? p.a + src * p.lda + k + 16 * chunk : p.a, ok);
      }
      if (t == 0) {
        mbar_arrive_expect_tx(&s.full[stage], kBN * kBK);
        const int e = kShape == TileShape::kRoutedM ? w.expert : 0;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          tma_load_3d(smem_u32(s.b[stage]) + j * kBoxRows * kBK, &p.tmap_b, &s.full[stage], k,
                      fp8_box_row(p, w.n_tile, j), e);
      }
      mbar_arrive_cp_async(&s.full[stage]);
      // Scales: one 32-bit word per row and stage (4 E8M0 bytes, or one float32), converted here.
      const int kw = k / kBK * kScaleBytesPerK128;
      if (t < kBM) {
        const int64_t src = s.rows[t];
        const uint32_t word =
            src >= 0 ? *reinterpret_cast<const uint32_t*>(p.a_scale + src * p.a_scale_ld + kw) : 0u;
#pragma unroll
        for (int j = 0; j < kSteps; ++j)
          if (R == Recipe::kMx || j == 0)
            s.sa[stage][j][t] = scale_value<R>(R == Recipe::kMx ? word >> (8 * j) : word);
      }
      const uint8_t* b_scale =
          p.b_scale + (kShape == TileShape::kRoutedM ? w.expert * p.b_scale_expert_stride : 0);
      if constexpr (kBPerRow) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int rho = t + 128 * h;
          const int n = fp8_box_row(p, w.n_tile, rho / kBoxRows) + rho % kBoxRows;
          const uint32_t word =
              n < p.b_rows ? *reinterpret_cast<const uint32_t*>(b_scale + n * p.b_scale_ld + kw)
                           : 0u;
#pragma unroll
          for (int j = 0; j < kSteps; ++j)
            if (R == Recipe::kMx || j == 0)
              s.sb[stage][j][rho] = scale_value<R>(R == Recipe::kMx ? word >> (8 * j) : word);
        }
      } else if (t < 4) {  // one float32 per 64-row box (each box lies in one 128-row block)
        const int n = fp8_box_row(p, w.n_tile, t);
        const uint32_t word =
            n < p.b_rows
                ? *reinterpret_cast<const uint32_t*>(b_scale + (n / 128) * p.b_scale_ld + kw)
                : 0u;
        s.sb[stage][0][t] = scale_value<R>(word);
      }
      mbar_arrive(&s.full[stage]);  // release: the scale stores above
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
  }
}

__device__ __forceinline__ float amax_merge(float m, float v) {
  return (v > m || v != v) ? v : m;  // both >= 0 or NaN
}
__device__ __forceinline__ float quad_amax(float m) {
  m = amax_merge(m, __shfl_xor_sync(0xffffffffu, m, 1));
  return amax_merge(m, __shfl_xor_sync(0xffffffffu, m, 2));
}

// kGluQuant: a = silu(gate) * up of this warpgroup's 64 F columns (gate value i pairs with up
// value i + 32), quantized along F: mxfp8 blocks of 32 lie inside one quad's values of a row;
// fp8_block's 128 columns span both warpgroups, which exchange row maxima through smem.
template <Recipe R, class T>
__device__ __forceinline__ void glu_quant_epilogue(const Fp8GemmParams& p, const Fp8Tile& w,
                                                   const float* acc, int cw, int t, Fp8Smem& s,
                                                   int parity) {
  const int F = p.N;
  const int f_base = w.n_tile * (kBN / 2) + 64 * cw;
  float a[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) a[i] = acc[i] * sigmoidf(acc[i]) * acc[i + 32];
  T* h = static_cast<T*>(p.epi.out2);  // [P, 2F] gate | up, saved for the backward
  if (h) {
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
      const int r = frag_row(i, t);
      if (r >= w.rows) continue;
      T* row = h + static_cast<int64_t>(w.row0 + r) * 2 * F + f_base + frag_col(i, t);
      store2(row, acc[i], acc[i + 1]);
      store2(row + F, acc[i + 32], acc[i + 33]);
    }
  }
  constexpr int kBlocks = R == Recipe::kMx ? 2 : 1;  // scale blocks in 64 columns
  float m[2][kBlocks];
#pragma unroll
  for (int rh = 0; rh < 2; ++rh)
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) m[rh][b] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int b = kBlocks == 2 ? (i >> 4) : 0;  // column 8 (i >> 2) + ...: block 32 = i >> 4
    m[(i >> 1) & 1][b] = amax_combine(m[(i >> 1) & 1][b], a[i]);
  }
#pragma unroll
  for (int rh = 0; rh < 2; ++rh)
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) m[rh][b] = quad_amax(m[rh][b]);
  if constexpr (R == Recipe::kBlock) {
#pragma unroll
    for (int rh = 0; rh < 2; ++rh)
      if ((t & 3) == 0) s.xchg[parity][cw][frag_row(2 * rh, t)] = m[rh][0];
    consumer_sync();
#pragma unroll
    for (int rh = 0; rh < 2; ++rh)
      m[rh][0] = amax_merge(m[rh][0], s.xchg[parity][cw ^ 1][frag_row(2 * rh, t)]);
  }
  BlockScale bs[2][kBlocks];
#pragma unroll
  for (int rh = 0; rh < 2; ++rh)
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) bs[rh][b] = block_scale<R>(m[rh][b]);
#pragma unroll
  for (int i = 0; i < 32; i += 2) {
    const int rh = (i >> 1) & 1, r = frag_row(i, t);
    if (r >= w.rows) continue;
    const uint16_t q =
        quantize_pair<R>(make_float2(a[i], a[i + 1]), bs[rh][kBlocks == 2 ? (i >> 4) : 0]);
    *reinterpret_cast<uint16_t*>(p.q_out + static_cast<int64_t>(w.row0 + r) * F + f_base +
                                 frag_col(i, t)) = q;
  }
  if ((t & 3) == 0) {
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int r = frag_row(2 * rh, t);
      if (r >= w.rows) continue;
      uint8_t* row_scales = p.q_scale + static_cast<int64_t>(w.row0 + r) * (F / 32);
      if constexpr (R == Recipe::kMx) {
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) row_scales[f_base / 32 + b] = bs[rh][b].stored;
      } else if (cw == 0) {
        reinterpret_cast<uint32_t*>(row_scales)[w.n_tile] = bs[rh][0].stored;
      }
    }
  }
}

template <Recipe R, TileShape kShape, bool kBPerRow, Epi8 kEpi, class T>
__device__ void fp8_consumer(const Fp8GemmParams& p, Fp8Smem& s, const int* s_prefix,
                             const int* s_offset, int cw, int t) {
  using namespace cute;
  using Elem = cute::float_e4m3_t;
  using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                             Shape<Int<kBM>, Int<kBK>, Int<kStages>>{}));
  using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                             Shape<Int<kBN>, Int<kBK>, Int<kStages>>{}));
  using TiledMma = decltype(make_tiled_mma(SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>{},
                                           Layout<Shape<_1, _2, _1>>{}));  // warpgroups split N
  static_assert(sizeof(Fp8Smem::a[0]) == cosize(SmemLayoutA{}) / kStages, "A stage size");
  static_assert(sizeof(Fp8Smem::b[0]) == cosize(SmemLayoutB{}) / kStages, "B stage size");
  Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<Elem*>(&s.a[0][0])), SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<Elem*>(&s.b[0][0])), SmemLayoutB{});
  TiledMma mma;
  auto thr = mma.get_thread_slice(cw * 128 + t);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA,MMA_M,MMA_K,STAGES) descriptors
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));  // (MMA,MMA_N,MMA_K,STAGES)
  Tensor part = partition_fragment_C(mma, Shape<Int<kBM>, Int<kBN>>{});  // (MMA,1,1): 64 f32
  static_assert(decltype(size(part))::value == 64, "64 accumulators per thread");
  float acc[64];
  const int r0 = frag_row(0, t), r1 = frag_row(2, t);
  const int total = fp8_total_tiles<kShape>(p, s_prefix);
  int stage = 0, phase = 0, parity = 0;
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const Fp8Tile w = fp8_decode<kShape>(p, tile, s_prefix, s_offset);
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    for (int k0 = 0; k0 < w.k_len; k0 += kBK) {
      mbar_wait(&s.full[stage], phase);
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        if (R == Recipe::kMx || j == 0) mma.accumulate_ = GMMA::ScaleOut::Zero;
        warpgroup_fence_operand(part);
        warpgroup_arrive();
        gemm(mma, tCrA(_, _, j, stage), tCrB(_, _, j, stage), part);
        mma.accumulate_ = GMMA::ScaleOut::One;
        warpgroup_commit_batch();
        if (R == Recipe::kMx || j == kSteps - 1) {
          warpgroup_wait<0>();
          warpgroup_fence_operand(part);
          const int js = R == Recipe::kMx ? j : 0;
          const float a0 = s.sa[stage][js][r0], a1 = s.sa[stage][js][r1];
          if constexpr (kBPerRow) {
            const float* sb = &s.sb[stage][js][cw * kWgN];
#pragma unroll
            for (int i = 0; i < 64; ++i)
              acc[i] = fmaf(part(i) * sb[frag_col(i, t)], ((i >> 1) & 1) ? a1 : a0, acc[i]);
          } else {
            const float b0 = s.sb[stage][0][2 * cw], b1 = s.sb[stage][0][2 * cw + 1];
            const float f00 = a0 * b0, f01 = a0 * b1, f10 = a1 * b0, f11 = a1 * b1;
#pragma unroll
            for (int i = 0; i < 64; ++i) {
              const bool lower = (i >> 1) & 1, right = i >= 32;  // frag_col(i) >= 64
              acc[i] = fmaf(part(i), lower ? (right ? f11 : f10) : (right ? f01 : f00), acc[i]);
            }
          }
        }
      }
      if (t == 0) mbar_arrive(&s.empty[stage]);  // this warpgroup is done with the stage
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    if constexpr (kEpi == Epi8::kGluQuant) {
      glu_quant_epilogue<R, T>(p, w, acc, cw, t, s, parity);
      parity ^= 1;
    } else {
      WorkTile ww;
      ww.expert = w.expert, ww.row0 = w.row0, ww.rows = w.rows;
      ww.n_tile = 2 * w.n_tile + cw, ww.k_off = w.k_off, ww.k_len = w.k_len;
      constexpr Epi kBf16Epi = kEpi == Epi8::kWeighted    ? Epi::kWeighted
                               : kEpi == Epi8::kSwiGLUBwd ? Epi::kSwiGLUBwd
                               : kEpi == Epi8::kStoreRows ? Epi::kStoreRows
                               : kEpi == Epi8::kStoreGLU  ? Epi::kStoreGLU
                                                          : Epi::kStoreCast;
      run_epilogue<T, kBf16Epi, kWgN>(p.epi, ww, [&](int i) { return acc[i]; }, 0, t);
    }
  }
}

template <Recipe R, TileShape kShape, bool kBPerRow, Epi8 kEpi, class T>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_kernel(const __grid_constant__ Fp8GemmParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  Fp8Smem& s = *reinterpret_cast<Fp8Smem*>(base);
  int* s_prefix = reinterpret_cast<int*>(base + sizeof(Fp8Smem));  // tile_prefix or k_offset
  int* s_offset = s_prefix + p.experts + 1;                        // expert_offset or k_offset
  const int* prefix_src = kShape == TileShape::kExpertK ? p.k_offset : p.tile_prefix;
  const int* offset_src = kShape == TileShape::kExpertK ? p.k_offset : p.expert_offset;
  for (int i = threadIdx.x; i <= p.experts; i += blockDim.x) {
    s_prefix[i] = prefix_src[i];
    s_offset[i] = offset_src[i];
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&s.full[i], 2 * 128 + 1);  // cp.async arrivals, scale-store arrivals, TMA bytes
      mbar_init(&s.empty[i], 2);           // one thread per consumer warpgroup
    }
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 72;\n");
    if (t == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.tmap_b) : "memory");
    fp8_producer<R, kShape, kBPerRow>(p, s, s_prefix, s_offset, t);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\n");
    fp8_consumer<R, kShape, kBPerRow, kEpi, T>(p, s, s_prefix, s_offset, wg - 1, t);
  }
#endif
}

template <Recipe R, TileShape kShape, bool kBPerRow, Epi8 kEpi, class T>
cudaError_t launch_fp8_gemm(const Fp8GemmParams& p, int num_sms, cudaStream_t stream) {
  const size_t smem = fp8_smem_bytes(p.experts);
  auto* kernel = fp8_gemm_kernel<R, kShape, kBPerRow, kEpi, T>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<num_sms, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mok::cuda::fp8
