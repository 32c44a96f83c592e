// The Hopper FP8 grouped GEMM of both recipes (fp8_format.cuh): E4M3 operands, float32
// accumulation, block scales applied in float32 by the CUDA cores ("promotion").
//
//   CTA tile 128 (M) x 256 (N) x 128 (K per stage), the BF16 kernel's tile (mainloop_sm90.cuh),
//   so the routing schedule and the epilogues are shared with it. Warpgroup 0 produces;
//   warpgroups 1 and 2 consume 64 rows each, their 256 columns as two halves of 128 (wgmma
//   m64n128k32, both operands K-major as FP8 wgmma requires). A scale block covers 128 K
//   (fp8_block) or 32 K (mxfp8): the wgmmas of one half and one scale block accumulate into a fresh
//   register tile `part` (64 floats), which is added to the float32 accumulator (128 floats) times
//   (scale of the A row) x (scale of the B column). FP8 wgmma accumulates with limited precision,
//   so no more than one scale block ever sums inside the tensor cores.
//
//   Operand A: rows of an FP8 matrix, K contiguous, gathered (routed rows) or not, by cp.async into
//   128B-swizzled smem; its scales, one 32-bit word per row per stage: fp8_block's float32 by
//   cp.async as well, so the producer never waits on a load; mxfp8's 4 E8M0 bytes converted to
//   float32 per k32 step by the producer (as its B scales: see below).
//   Operand B: the experts' FP8 weights [E][N][K] (or one [N][K] matrix) by TMA, two
//   64-row boxes per half; scales per B row (mxfp8, and the weight gradients' token-wise scales)
//   or per 128-row block (fp8_block weights: one per half). fp8_block's B scales are float32 words
//   and come by cp.async like A's; mxfp8's per-row E8M0 bytes are converted to float32 by the
//   producer (one conversion per row and k32 step, instead of one per accumulator element in the
//   consumers, whose promotion already binds mxfp8 and whose registers are full).
//
//   Two tile shapes:
//   kRoutedM  rows = expert-sorted positions (128-row tiles of one expert: mtile_prefix), B = that
//             expert's weights, K = the full reduction dim. Epilogues as the BF16 path, plus
//             kGluQuant: SwiGLU whose activations are quantized along F right here (a warpgroup
//             holds whole 128-column rows of a: gate in half 0, up in half 1).
//   kExpertK  weight gradients: C_e[m, n] = sum_p A[m, p] B[n, p] over the positions p of expert
//             e, both operands transposed and quantized along positions (fp8_quantize.cuh), each
//             expert's positions padded to a multiple of 128 (k_offset).
#pragma once

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cuda/device/epilogue_staged.cuh"
#include "cuda/device/fp8_format.cuh"
#include "cuda/device/mainloop_sm90.cuh"  // producer_sync, consumer_sync

namespace mok::cuda::fp8 {

constexpr int kBM = kTileM, kBN = 256, kBK = 128, kThreads = 384;
static_assert(kBM == 128, "two consumer warpgroups of 64 rows");
constexpr int kHalfN = kBN / 2;   // columns of one wgmma / one `part` tile
constexpr int kSteps = kBK / 32;  // k32 wgmma steps per stage
constexpr int kBoxRows = 64;      // rows of one TMA box of B (128 bytes wide)

enum class TileShape { kRoutedM, kExpertK };
// kGluQuant: SwiGLU of the gate/up tile, quantized to FP8 (+ h saved when epi.out2 is set).
// Otherwise one of the BF16 path's epilogues (epilogue.cuh).
enum class Epi8 { kGluQuant, kWeighted, kSwiGLUBwd, kStoreRows, kStoreGLU, kStoreCast };

struct Fp8GemmParams {
  // schedule (device arrays)
  const int* expert_offset;  // [E+1] kRoutedM: first position of each expert
  const int* mtile_prefix;   // [E+1] kRoutedM: exclusive prefix of ceil(count / 128)
  const int* k_offset;       // [E+1] kExpertK: first padded position of each expert
  int experts;
  int M, N, K;  // kRoutedM: N, K (M is the positions); kExpertK: M, N (K per expert)
  int b_rows;   // rows of B per expert (N, or 2F for gate/up tiles): scale bounds
  int n_tiles;  // 256-wide tiles along N (gate/up: 128 F columns each)
  int m_tiles;  // kExpertK: 128-row tiles along M
  bool glu;     // B rows = [gate | up], glu_offset = F
  int glu_offset;
  // A: FP8 [rows][lda] (K contiguous); scales: K / 32 bytes per row (4 bytes per 128 K)
  const uint8_t* a;
  int64_t lda;
  const int* a_gather;  // kRoutedM: row of position p is a_gather[p] (nullptr: p)
  const uint8_t* a_scale;
  int64_t a_scale_ld;  // bytes per row of scales
  // B: FP8 by TMA (tmap_b: [E][rows][K], boxes 128 x 64); scales
  const uint8_t* b_scale;
  int64_t b_scale_expert_stride;  // bytes per expert
  int64_t b_scale_ld;             // bytes per scale row (per B row, or per 128 B rows)
  // kGluQuant outputs: a = SwiGLU(h) as FP8 [P][F] and its scales (F / 32 bytes per row)
  uint8_t* q_out;
  uint8_t* q_scale;
  bool staged_out;  // row outputs through shared memory (bf16 only, where it fits)
  GemmParams epi;  // the BF16 path's epilogue fields (out, out2, h, topk_weights, sorted_slot, ...)
  alignas(64) CUtensorMap tmap_b;
};

// The BF16 kernels' tile schedule (gemm_params.cuh: total_tiles, decode_tile) of a tile shape:
// kExpertK is their routed-K order, kRoutedM their routed-M order (which B's layout does not
// change; kRoutedBN stands for it).
template <TileShape kShape>
constexpr Mode kScheduleOf = kShape == TileShape::kExpertK ? Mode::kRoutedK : Mode::kRoutedBN;

// First B row of box j (0..3): boxes 0, 1 fill half 0, boxes 2, 3 half 1. Gate/up tiles put the
// 128 gate columns of F in half 0 and their up columns in half 1.
__device__ __forceinline__ int fp8_box_row(const Fp8GemmParams& p, int n_tile, int j) {
  if (p.glu) return (j >= 2 ? p.glu_offset : 0) + n_tile * kHalfN + (j & 1) * kBoxRows;
  return n_tile * kBN + j * kBoxRows;
}

// Scale factors kept per stage: mxfp8 one per k32 step, fp8_block one per stage.
template <Recipe R>
constexpr int kScaleSteps = R == Recipe::kMx ? kSteps : 1;
// k32 steps per promotion group, the wgmmas that accumulate in the tensor cores before their
// sum is scaled into the float32 accumulator: one scale block (mxfp8 32 K, fp8_block 128 K).
template <Recipe R>
constexpr int kGroupSteps = kSteps / kScaleSteps<R>;
// Ring depth: 48 KB of operands per stage. fp8_block fits 4 stages in the 227 KB opt-in limit
// (with the staging area and the tables of kFp8MaxExperts experts); mxfp8's per-step float32
// scales (16 KB per stage) leave room for 3.
template <Recipe R>
constexpr int kStagesOf = R == Recipe::kMx ? 3 : 4;

template <Recipe R>
struct alignas(1024) Fp8Smem {
  static constexpr int kStages = kStagesOf<R>;
  uint8_t a[kStages][kBM * kBK];        // (128, 128) per stage, 128B-swizzled rows
  uint8_t b[2][kStages][kHalfN * kBK];  // per half (128, 128) per stage: two TMA boxes
  // Scales as float32 bits: fp8_block's words as they are stored (cp.async); mxfp8's converted
  // by the producer, one per k32 step. A: per tile row; B: per B row, or (fp8_block weights) per
  // half in [.][0][0..1].
  uint32_t sa[kStages][kScaleSteps<R>][kBM];
  uint32_t sb[kStages][kScaleSteps<R>][kBN];
  uint64_t full[kStages], empty[kStages];
  TileRing tiles;     // kRoutedM with epi.tile_counter: the dynamic tile order (mainloop_sm90.cuh)
  int64_t rows[kBM];  // source row of each tile row (-1: none)
  alignas(128) char out_stage[kOutStageBytes];  // staged row stores (mainloop_sm90.cuh)
};
// The `full` barrier's arrivals per stage: each producer thread's cp.async arrival, the TMA
// thread's expect_tx arrival, and (mxfp8) each producer thread's scale stores.
template <Recipe R>
constexpr int kFullArrivals = 128 + 1 + (R == Recipe::kMx ? 128 : 0);
// The expert tables follow the struct: mtile_prefix / k_offset [E+1], expert_offset / k_offset.
template <Recipe R>
constexpr size_t fp8_smem_bytes(int64_t experts) {
  return 1024 + sizeof(Fp8Smem<R>) + 2 * sizeof(int) * static_cast<size_t>(experts + 1);
}

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

// The producer's per-stage work is address arithmetic for 9-11 copies per thread, on few
// registers (setmaxnreg below): every address that does not change along K is made once per
// tile — the source of each of the thread's 8 A chunks, its row's A scale, its B scale rows —
// so that a stage adds k to each and issues. (Recomputing them per stage from the row table,
// with 64-bit multiplies and the parameters reloaded from the constant bank, made the producer
// the pipeline's bottleneck: the consumers waited on `full` a third of the time.)
template <Recipe R, TileShape kShape, bool kBPerRow>
__device__ void fp8_producer(const Fp8GemmParams& p, Fp8Smem<R>& s, const int* s_prefix,
                             const int* s_offset, int t) {
  constexpr int kStages = Fp8Smem<R>::kStages;
  constexpr int kBScaleRows = kBPerRow ? 2 : 1;  // B scale words this thread copies per stage
  const int total = total_tiles<kScheduleOf<kShape>>(p, s_prefix);
  const int chunk = t & 7;  // this thread's 16-byte chunk of every A row it copies
  // Its A chunks land at dst0 + 2048 i in a stage: rows (t >> 3) + 16 i share the 128B
  // swizzle phase (t >> 3) & 7.
  const uint32_t dst0 = (t >> 3) * 128 + ((chunk ^ ((t >> 3) & 7)) << 4);
  const bool b_scale_thread = kBPerRow || t < 2;
  int stage = 0, phase = 0;
  const bool dynamic = kShape == TileShape::kRoutedM && p.epi.tile_counter != nullptr;
  PipelineState<kTileRing> walk;
  for (int it = 0;; ++it) {
    const int tile = dynamic ? producer_tile(s.tiles, walk, p.epi.tile_counter, total, t)
                             : static_cast<int>(blockIdx.x + it * gridDim.x);
    if (tile < 0 || tile >= total) break;
    const WorkTile w = decode_tile<kScheduleOf<kShape>>(p, tile, s_prefix, s_offset);
    producer_sync();                       // the previous tile's rows are no longer read
    const uint8_t* a_scale_row = nullptr;  // row t's scales (nullptr: no row, zero fill)
    {
      int64_t src = -1;
      if (t < w.rows) {
        const int pos = w.row0 + t;
        src = (kShape == TileShape::kRoutedM && p.a_gather) ? p.a_gather[pos] : pos;
      }
      if (src >= 0) a_scale_row = p.a_scale + src * p.a_scale_ld;
      s.rows[t] = src;
    }
    producer_sync();
    const uint8_t* a_src[8];  // chunk sources at K = 0 (nullptr: no row)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t src = s.rows[(t >> 3) + 16 * i];
      a_src[i] = src >= 0 ? p.a + src * p.lda + 16 * chunk : nullptr;
    }
    const int e = kShape == TileShape::kRoutedM ? w.expert : 0;
    const uint8_t* b_scale = p.b_scale + e * p.b_scale_expert_stride;
    // B scale rows: per B row (kBPerRow: this thread's row of each half) or per 128-row block
    // (threads 0 and 1: one word per half); nullptr past b_rows (zero fill).
    const uint8_t* b_scale_row[kBScaleRows];
#pragma unroll
    for (int h = 0; h < kBScaleRows; ++h) {
      const int n = kBPerRow ? fp8_box_row(p, w.n_tile, 2 * h + (t >> 6)) + (t & 63)
                             : fp8_box_row(p, w.n_tile, 2 * t);
      b_scale_row[h] = b_scale_thread && n < p.b_rows
                           ? b_scale + static_cast<int64_t>(kBPerRow ? n : n / 128) * p.b_scale_ld
                           : nullptr;
    }
    for (int k0 = 0; k0 < w.k_len; k0 += kBK) {
      mbar_wait(&s.empty[stage], phase ^ 1);
      const int k = w.k_off + k0;  // absolute K of the stage in A and B
      const uint32_t stage_a = smem_u32(s.a[stage]) + dst0;
#pragma unroll
      for (int i = 0; i < 8; ++i)  // A: 128 rows x 8 chunks of 16 bytes
        cp_async_16(stage_a + 2048 * i, a_src[i] ? a_src[i] + k : p.a, a_src[i] != nullptr);
      if (t == 0) {
        mbar_arrive_expect_tx(&s.full[stage], kBN * kBK);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          tma_load_3d(smem_u32(s.b[j >> 1][stage]) + (j & 1) * kBoxRows * kBK, &p.tmap_b,
                      &s.full[stage], k, fp8_box_row(p, w.n_tile, j), e);
      }
      // Scales: one 32-bit word per row and stage (4 E8M0 bytes, or one float32). A row past
      // the tile, or a B row past b_rows, reads as word 0 (zero fill), as its values do.
      const int kw = k / kBK * kScaleBytesPerK128;
      if constexpr (R == Recipe::kBlock) {
        cp_async_4(smem_u32(&s.sa[stage][0][t]), a_scale_row ? a_scale_row + kw : p.a_scale,
                   a_scale_row != nullptr);
        if (b_scale_thread) {
#pragma unroll
          for (int h = 0; h < kBScaleRows; ++h)  // smem row: half h, row t (or word t)
            cp_async_4(smem_u32(&s.sb[stage][0][kBPerRow ? t + 128 * h : t]),
                       b_scale_row[h] ? b_scale_row[h] + kw : b_scale, b_scale_row[h] != nullptr);
        }
        mbar_arrive_cp_async(&s.full[stage]);  // A, its scales, B's scales
      } else {
        mbar_arrive_cp_async(&s.full[stage]);  // A's values
        static_assert(R != Recipe::kMx || kBPerRow, "mxfp8 B scales are per B row");
        {
          const uint32_t word =
              a_scale_row ? *reinterpret_cast<const uint32_t*>(a_scale_row + kw) : 0u;
#pragma unroll
          for (int j = 0; j < kScaleSteps<R>; ++j)
            s.sa[stage][j][t] = __float_as_uint(scale_value<R>(word >> (8 * j)));
        }
#pragma unroll
        for (int h = 0; h < kBScaleRows; ++h) {
          const uint32_t word =
              b_scale_row[h] ? *reinterpret_cast<const uint32_t*>(b_scale_row[h] + kw) : 0u;
#pragma unroll
          for (int j = 0; j < kScaleSteps<R>; ++j)
            s.sb[stage][j][t + 128 * h] = __float_as_uint(scale_value<R>(word >> (8 * j)));
        }
        mbar_arrive(&s.full[stage]);  // release: the scale stores above
      }
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
  }
}

template <Recipe R, TileShape kShape, bool kBPerRow, Epi8 kEpi, class T>
__device__ void fp8_consumer(const Fp8GemmParams& p, Fp8Smem<R>& s, const int* s_prefix,
                             const int* s_offset, int wg, int t) {
  using namespace cute;
  using Elem = cute::float_e4m3_t;
  constexpr int kStages = Fp8Smem<R>::kStages;
  using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                             Shape<Int<kBM>, Int<kBK>, Int<kStages>>{}));
  using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                             Shape<Int<kHalfN>, Int<kBK>, Int<kStages>>{}));
  using TiledMma = decltype(make_tiled_mma(SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>{},
                                           Layout<Shape<_2, _1, _1>>{}));  // warpgroups split M
  static_assert(sizeof(s.a) == cosize(SmemLayoutA{}), "A ring size");
  static_assert(sizeof(s.b[0]) == cosize(SmemLayoutB{}), "B ring size (one half)");
  Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<Elem*>(&s.a[0][0])), SmemLayoutA{});
  Tensor sB0 = make_tensor(make_smem_ptr(reinterpret_cast<Elem*>(&s.b[0][0][0])), SmemLayoutB{});
  Tensor sB1 = make_tensor(make_smem_ptr(reinterpret_cast<Elem*>(&s.b[1][0][0])), SmemLayoutB{});
  TiledMma mma;
  auto thr = mma.get_thread_slice(wg * 128 + t);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));    // (MMA,1,MMA_K,STAGES) descriptors
  Tensor tCrB0 = thr.make_fragment_B(thr.partition_B(sB0));  // (MMA,1,MMA_K,STAGES)
  Tensor tCrB1 = thr.make_fragment_B(thr.partition_B(sB1));
  Tensor part = partition_fragment_C(mma, Shape<Int<kBM>, Int<kHalfN>>{});  // (MMA,1,1) 64 f32
  static_assert(decltype(size(part))::value == 64, "64 accumulators per thread and half");
  float acc[128];  // value i + 64 h: half h, in the wgmma order of a 64 x 256 warpgroup tile
  const int r0 = 64 * wg + frag_row(0, t), r1 = 64 * wg + frag_row(2, t);
  const int total = total_tiles<kScheduleOf<kShape>>(p, s_prefix);
  // The SwiGLU epilogues in bf16 keep the tile's last stage as their buffers
  // (epilogue_staged.cuh); routed-M tiles have K > 0, so there is always one.
  constexpr bool kHeld =
      kShape == TileShape::kRoutedM && std::is_same_v<T, bf16> &&
      (kEpi == Epi8::kGluQuant || kEpi == Epi8::kSwiGLUBwd || kEpi == Epi8::kStoreGLU);
  int stage = 0, phase = 0, held = 0;
  const bool dynamic = kShape == TileShape::kRoutedM && p.epi.tile_counter != nullptr;
  PipelineState<kTileRing> walk;
  for (int it = 0;; ++it) {
    const int tile =
        dynamic ? next_tile(s.tiles, walk) : static_cast<int>(blockIdx.x + it * gridDim.x);
    if (tile < 0 || tile >= total) break;
    const WorkTile w = decode_tile<kScheduleOf<kShape>>(p, tile, s_prefix, s_offset);
    if constexpr (kHeld && kEpi == Epi8::kSwiGLUBwd) prefetch_h_to_l2<kBN>(p.epi, w, wg, t);
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    // A routed-M warpgroup none of whose 64 rows is in the tile (an expert with at most 64
    // positions in its last tile: decode-sized batches) issues no wgmma and no promotion; it
    // still waits for each stage to fill before handing it back, so its arrivals stay in step
    // with the ring. Its accumulators stay zero, and no epilogue stores a row past w.rows.
    // (The weight gradients' M is H or F: a multiple of 128 in the FP8 layer.)
    const bool idle = kShape == TileShape::kRoutedM && 64 * wg >= w.rows;
    for (int k0 = 0; k0 < w.k_len; k0 += kBK) {
      mbar_wait(&s.full[stage], phase);
      fence_proxy_async();  // cp.async wrote A through the generic proxy; wgmma reads async
      if (!idle) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int g = 0; g < kSteps / kGroupSteps<R>; ++g) {
            // One promotion group is one wgmma batch: a single fence before its first wgmma and
            // a single commit after its last. A fence or commit between two wgmmas of a batch
            // makes each wait for the previous one's accumulator (SASS: an ARRIVE and a
            // scoreboard per QGMMA), so the steps would run one latency apart instead of back to
            // back in the tensor pipe.
            mma.accumulate_ = GMMA::ScaleOut::Zero;
            warpgroup_fence_operand(part);
            warpgroup_arrive();
#pragma unroll
            for (int j = g * kGroupSteps<R>; j < (g + 1) * kGroupSteps<R>; ++j) {
              if (h == 0)
                gemm(mma, tCrA(_, _, j, stage), tCrB0(_, _, j, stage), part);
              else
                gemm(mma, tCrA(_, _, j, stage), tCrB1(_, _, j, stage), part);
              mma.accumulate_ = GMMA::ScaleOut::One;
            }
            warpgroup_commit_batch();
            warpgroup_wait<0>();
            warpgroup_fence_operand(part);
            const int js = R == Recipe::kMx ? g : 0;  // the group's scale step
            const float a0 = __uint_as_float(s.sa[stage][js][r0]);
            const float a1 = __uint_as_float(s.sa[stage][js][r1]);
            if constexpr (kBPerRow) {
              const float* sb = reinterpret_cast<const float*>(&s.sb[stage][js][h * kHalfN]);
#pragma unroll
              for (int i = 0; i < 64; ++i)
                acc[i + 64 * h] =
                    fmaf(part(i) * sb[frag_col(i, t)], ((i >> 1) & 1) ? a1 : a0, acc[i + 64 * h]);
            } else {
              const float b = __uint_as_float(s.sb[stage][0][h]);
              const float f0 = a0 * b, f1 = a1 * b;
#pragma unroll
              for (int i = 0; i < 64; ++i)
                acc[i + 64 * h] = fmaf(part(i), ((i >> 1) & 1) ? f1 : f0, acc[i + 64 * h]);
            }
          }
        }
      }
      if (kHeld && k0 + kBK >= w.k_len)
        held = stage;
      else if (t == 0)
        mbar_arrive(&s.empty[stage]);  // this warpgroup is done with the stage
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    auto value = [&](int i) { return acc[i]; };
    if constexpr (kHeld) {
      consumer_sync();  // both warpgroups' wgmmas are done reading the held stage
      const EpiBuffers eb =
          held_buffers(smem_u32(s.a[held]), smem_u32(s.b[0][held]), smem_u32(s.b[1][held]), wg);
      if constexpr (kEpi == Epi8::kGluQuant)
        glu_quant_epilogue<R, T, true>(p, w, acc, wg, t, eb);
      else if constexpr (kEpi == Epi8::kSwiGLUBwd)
        swiglu_bwd_staged<kBN>(p.epi, w, value, wg, t, eb);
      else
        glu_staged<Epi::kStoreGLU, kBN>(p.epi, w, value, wg, t, eb);
      release_held_stage(&s.empty[held], wg, t);
    } else if constexpr (kEpi == Epi8::kGluQuant) {
      glu_quant_epilogue<R, T, false>(p, w, acc, wg, t, EpiBuffers{});
    } else {
      constexpr Epi kBf16Epi = kEpi == Epi8::kWeighted    ? Epi::kWeighted
                               : kEpi == Epi8::kSwiGLUBwd ? Epi::kSwiGLUBwd
                               : kEpi == Epi8::kStoreRows ? Epi::kStoreRows
                               : kEpi == Epi8::kStoreGLU  ? Epi::kStoreGLU
                                                          : Epi::kStoreCast;
      constexpr bool kCanStage =
          std::is_same_v<T, bf16> && (kBf16Epi == Epi::kWeighted || kBf16Epi == Epi::kStoreRows ||
                                      kBf16Epi == Epi::kStoreCast);
      if constexpr (kCanStage) {
        if (p.staged_out) {
          store_rows_staged<kBf16Epi, kBN, false>(
              p.epi, w, value, wg, t, smem_u32(s.out_stage) + wg * (kOutStageBytes / 2));
          continue;
        }
      }
      run_epilogue<T, kBf16Epi, kBN>(p.epi, w, value, wg, t);
    }
  }
}

template <Recipe R, TileShape kShape, bool kBPerRow, Epi8 kEpi, class T>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_kernel(const __grid_constant__ Fp8GemmParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  Fp8Smem<R>& s = *reinterpret_cast<Fp8Smem<R>*>(base);
  int* s_prefix = reinterpret_cast<int*>(base + sizeof(Fp8Smem<R>));  // mtile_prefix / k_offset
  int* s_offset = s_prefix + p.experts + 1;                           // expert_offset / k_offset
  const int* prefix_src = kShape == TileShape::kExpertK ? p.k_offset : p.mtile_prefix;
  const int* offset_src = kShape == TileShape::kExpertK ? p.k_offset : p.expert_offset;
  for (int i = threadIdx.x; i <= p.experts; i += blockDim.x) {
    s_prefix[i] = prefix_src[i];
    s_offset[i] = offset_src[i];
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < Fp8Smem<R>::kStages; ++i) {
      mbar_init(&s.full[i], kFullArrivals<R>);
      mbar_init(&s.empty[i], 2);  // one thread per consumer warpgroup
    }
    init_tile_ring(s.tiles);
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
    if (t == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.tmap_b) : "memory");
    fp8_producer<R, kShape, kBPerRow>(p, s, s_prefix, s_offset, t);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    fp8_consumer<R, kShape, kBPerRow, kEpi, T>(p, s, s_prefix, s_offset, wg - 1, t);
  }
#endif
}

template <Recipe R, TileShape kShape, bool kBPerRow, Epi8 kEpi, class T>
cudaError_t launch_fp8_gemm(const Fp8GemmParams& p, int num_sms, cudaStream_t stream) {
  const size_t smem = fp8_smem_bytes<R>(p.experts);
  auto* kernel = fp8_gemm_kernel<R, kShape, kBPerRow, kEpi, T>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<num_sms, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mok::cuda::fp8
