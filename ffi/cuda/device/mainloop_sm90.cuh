// The Hopper grouped GEMM (bf16 in, f32 accumulate): persistent, warp-specialized.
//   warpgroup 0      producer: fills a STAGES-deep ring of 128B-swizzled shared-memory tiles.
//                    The weight tile B always comes by TMA (tensor map: host/tma.h). A gathered
//                    A (routed rows) comes by cp.async, arrival on `full[s]` tied to the copies'
//                    completion (cp.async.mbarrier.arrive.noinc); with kTmaA (A not gathered) A
//                    comes by TMA as well and one thread drives the ring. Routed-K (weight
//                    gradients): both operands by TMA when both are in expert order (kTmaA), else
//                    one of them gathered position by position by cp.async.
//   warpgroups 1, 2  consumers: wgmma 64×BN×16 each (CuTe SS atoms), then the fused epilogue
//                    straight from registers, while the producer already fills the next tile.
// Tile order, operand addressing and epilogues are shared with the SIMT oracle (simt.cuh).
#pragma once

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cuda/device/epilogue_staged.cuh"
#include "cuda/device/pipeline.cuh"

namespace mok::cuda {

// kTmaA: A arrives by TMA as well as B. Routed-K: both operands by TMA (kTmaA), or one of them
// (A or B: GemmParams::a_gather / b_gather) gathered by the producer's threads. kRing: the ring's
// stages (pipeline.cuh: kRingStages).
template <Mode kMode, bool kTmaA, int kRing>
struct WgmmaConfig {
  static constexpr int BM = kTileM, BN = kWgmmaBN, BK = kWgmmaBK, kStages = kRing;
  static constexpr int kThreads = 384;
  using Elem = cute::bfloat16_t;
  static constexpr auto kMajorA =
      kMode == Mode::kRoutedK ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  static constexpr auto kMajorB =
      kMode == Mode::kRoutedBK ? cute::GMMA::Major::K : cute::GMMA::Major::MN;
  template <cute::GMMA::Major kMajor>
  using Atom =
      std::conditional_t<kMajor == cute::GMMA::Major::K, cute::GMMA::Layout_K_SW128_Atom<Elem>,
                         cute::GMMA::Layout_MN_SW128_Atom<Elem>>;
  // An MN-major operand tiles K before MN so that each 64(mn)×64(k) box is 8 KB contiguous, as
  // TMA writes it (routed-K A and B; B of routed-BN). A gathered routed-K operand is written in
  // the same boxes, so zero_tail_rows serves both ways of loading.
  using OrderA =
      std::conditional_t<kMajorA == cute::GMMA::Major::MN, cute::Step<cute::_2, cute::_1, cute::_3>,
                         cute::Step<cute::_1, cute::_2, cute::_3>>;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      Atom<kMajorA>{}, cute::Shape<cute::Int<BM>, cute::Int<BK>, cute::Int<kStages>>{},
      OrderA{}));  // (BM,BK,STAGES)
  using OrderB =
      std::conditional_t<kMajorB == cute::GMMA::Major::MN, cute::Step<cute::_2, cute::_1, cute::_3>,
                         cute::Step<cute::_1, cute::_2, cute::_3>>;
  using SmemLayoutB = decltype(cute::tile_to_shape(
      Atom<kMajorB>{}, cute::Shape<cute::Int<BN>, cute::Int<BK>, cute::Int<kStages>>{},
      OrderB{}));  // (BN,BK,STAGES)
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<kMajorA, kMajorB>{},
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));  // 2 warpgroups along M
  using Storage = SharedStorage<BM, BN, BK, kStages>;  // the shared memory's head (pipeline.cuh)
  static constexpr int kStageBytesA = Storage::kStageBytesA, kStageBytesB = Storage::kStageBytesB;
  static constexpr int kRingBytes = kStages * (kStageBytesA + kStageBytesB);
  static_assert(cute::cosize(SmemLayoutA{}) * 2 == kStages * kStageBytesA, "A ring size");
  static_assert(cute::cosize(SmemLayoutB{}) * 2 == kStages * kStageBytesB, "B ring size");
  static_assert(offsetof(Storage, a) == 0 && offsetof(Storage, b) == kStages * kStageBytesA &&
                    offsetof(Storage, full) == kRingBytes &&
                    offsetof(Storage, empty) == kRingBytes + kStages * sizeof(uint64_t) &&
                    offsetof(Storage, rows) == kRingBytes + 2 * kStages * sizeof(uint64_t) &&
                    offsetof(Storage, tiles) == offsetof(Storage, rows) + BM * sizeof(int64_t),
                "the kernel's carving (wgmma_gemm_kernel) follows Storage member by member");
};

// Byte offset of element (mn, k) inside stage 0. CuTe's layouts give the unswizzled offset (the
// swizzle lives in its smem pointer type), so the 128B swizzle (Swizzle<3,4,3> on bytes) is
// applied here; checked against CuTe's own tensor addressing for all four layouts.
template <class Layout>
__device__ __forceinline__ uint32_t swizzled(int mn, int k) {
  constexpr auto inner = Layout{}.layout_b();
  const uint32_t bytes = 2u * static_cast<uint32_t>(inner(mn, k, 0));
  return bytes ^ (((bytes >> 7) & 7u) << 4);
}

__device__ __forceinline__ void producer_sync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 2, 256;\n" ::: "memory"); }

// The dynamic tile order's ends (pipeline.cuh: TileRing), both kernels' routed-M GEMMs. `walk`
// goes over the ring's slots as PipelineState goes over a stage ring.
__device__ __forceinline__ void init_tile_ring(TileRing& r) {
  for (int i = 0; i < kTileRing; ++i) {
    mbar_init(&r.full[i], 1);     // the producer's first thread
    mbar_init(&r.empty[i], 256);  // every consumer thread
  }
}
// The producer's first thread: the next id from `counter` (-1 past `total`), published to the
// consumers once they have all read the id kTileRing slots back, and in `current`.
__device__ __forceinline__ int take_tile(TileRing& r, PipelineState<kTileRing>& walk, int* counter,
                                         int total) {
  mbar_wait(&r.empty[walk.stage], walk.phase ^ 1);
  int id = atomicAdd(counter, 1);
  if (id >= total) id = -1;
  r.id[walk.stage] = id;
  mbar_arrive(&r.full[walk.stage]);  // releases the id's store
  r.current = id;
  walk.advance();
  return id;
}
// A consumer thread: the next id.
__device__ __forceinline__ int next_tile(TileRing& r, PipelineState<kTileRing>& walk) {
  mbar_wait(&r.full[walk.stage], walk.phase);
  const int id = *reinterpret_cast<volatile int*>(&r.id[walk.stage]);
  mbar_arrive(&r.empty[walk.stage]);
  walk.advance();
  return id;
}
// The producer's other threads (with the first one): the id the first one took, through
// `current` after a producer barrier. Every producer thread read the previous id before the
// barriers of the previous tile's body, which the first thread passed before writing this one.
__device__ __forceinline__ int producer_tile(TileRing& r, PipelineState<kTileRing>& walk,
                                             int* counter, int total, int t) {
  if (t == 0) take_tile(r, walk, counter, total);
  producer_sync();
  return *reinterpret_cast<volatile int*>(&r.current);
}

// Routed-K by TMA: the last k-block of an expert holds `valid` < BK of its positions; the rows
// after them up to `end` (the wgmmas read rows < end; they are the next expert's positions)
// become zeros in both operands before the wgmma reads them. In the K-before-MN layouts a
// position is one 128-byte line per 64×64 box (the 128B swizzle permutes 16-byte chunks inside
// the line), so each zeroed row is whole lines. `c` is the consumer thread (0..255); all 256 call
// this, then meet at a named barrier.
template <int kBoxesA, int kBoxesB>
__device__ __forceinline__ void zero_tail_rows(uint32_t stage_a, uint32_t stage_b, int valid,
                                               int end, int c) {
  const int rows = end - valid;
  const int chunks = rows * 8 * (kBoxesA + kBoxesB);
  for (int i = c; i < chunks; i += 256) {
    const int chunk = i & 7, line = i >> 3;
    const int box = line / rows, row = valid + line % rows;
    const uint32_t base = box < kBoxesA ? stage_a + box * 8192 : stage_b + (box - kBoxesA) * 8192;
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(base + row * 128 + chunk * 16),
                 "r"(0)
                 : "memory");
  }
  fence_proxy_async();  // generic-proxy stores, read by wgmma through the async proxy
  consumer_sync();
}

// The producer warpgroup. With a gathered A, the row offsets of the current tile go through
// shared memory once, then every 16-byte chunk of A is one cp.async.
// B boxes of one stage (one thread): 4 boxes of 64(n)×64(k) (N-major B) or one of 64(k)×256(n)
// (K-major B). Out-of-range boxes are zero-filled and still count their full size; gate columns
// past F read up columns, which the epilogue masks.
template <Mode kMode, int BN>
__device__ __forceinline__ void tma_weight_tile(const GemmParams& p, const WorkTile& w, int k0,
                                                uint32_t stage_b, uint64_t* bar) {
  if constexpr (kMode == Mode::kRoutedBN) {
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) {
      const int half = BN / 2;
      const int n = p.glu ? (64 * j < half ? w.n_tile * half + 64 * j
                                           : p.glu_offset + w.n_tile * half + 64 * j - half)
                          : w.n_tile * BN + 64 * j;
      tma_load_3d(stage_b + j * 8192, &p.tmap_b, bar, n, k0, w.expert);
    }
  } else {
    tma_load_3d(stage_b, &p.tmap_b, bar, k0, w.n_tile * BN, w.expert);
  }
}

// One thread's share of a gathered routed-K stage: chunk `chunk` of every box of 4 positions,
// `first_line` + 4i (i < 4). The 8 threads of a position copy one 128-byte line of each box
// together, so each cp.async instruction of a warp reads 4 whole lines (coalesced). In the
// K-before-MN boxes (WgmmaConfig: 64(mn) × 64(k), a position is one 128-byte line) chunk c of
// line k of box b sits at b·8192 + k·128 + ((c ^ (k & 7)) << 4): swizzled<Layout>(64·b + 8·c, k)
// written out (checked against CuTe's layouts for A's 128 and B's 256 columns), so no address is
// derived from a runtime column. `rows[i]`: position i's row at the tile's first column plus
// this thread's chunk, nullptr past the expert's count; `cols`: the columns left from the
// tile's first one (M or N minus it; a multiple of 8).
template <int kBoxes>
__device__ __forceinline__ void gathered_positions(const bf16* const (&rows)[4], const bf16* any,
                                                   int cols, uint32_t stage, int first_line,
                                                   int chunk) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int line = first_line + 4 * i;
    const uint32_t at = stage + line * 128 + ((chunk ^ (line & 7)) << 4);
#pragma unroll
    for (int box = 0; box < kBoxes; ++box) {
      const bool ok = rows[i] != nullptr && 64 * box + 8 * chunk < cols;
      cp_async_16(at + box * 8192, ok ? rows[i] + 64 * box : any, ok);
    }
  }
}

// Routed-K with one operand gathered (the weight gradients on x or dy in token order): per
// k-block of 64 positions, warp w copies positions 16w..16w+15 of the gathered operand (all its
// boxes of 64 columns, 16-byte chunks), while thread 0 loads the other operand's boxes by TMA.
// The positions' tokens come from the gather table one k-block ahead (lane l < 16 loads
// position 16w + l's; the loads are in flight while the stage is waited for) and reach the
// lanes that copy them by shuffles. Positions past the expert's count and columns past M (A) or
// N (B) are zero-filled; the consumers zero the tail positions of both operands as on the TMA
// path.
template <class Cfg>
__device__ void wgrad_gathered_producer(const GemmParams& p, const int* s_prefix,
                                        const int* s_offset, uint64_t* full, uint64_t* empty,
                                        uint32_t sa, uint32_t sb, int t) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kStages = Cfg::kStages;
  static_assert(BK == 64, "4 warps × 16 positions per k-block");
  const bool gather_a = p.a_gather != nullptr;  // else B is the gathered one (host: launch.h)
  const int* gather = gather_a ? p.a_gather : p.b_gather;
  const bf16* src = static_cast<const bf16*>(gather_a ? p.a : p.b);
  const int64_t ld = gather_a ? p.lda : p.ldb;
  const int lane = t & 31, chunk = t & 7, sub = lane >> 3;
  const int mine = 16 * (t >> 5) + (lane & 15);  // the position whose token this lane loads
  const int first_line = 16 * (t >> 5) + sub;    // the positions this thread copies: + 4i
  const int total = total_tiles<Mode::kRoutedK>(p, s_prefix);
  PipelineState<kStages> pipe;
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const WorkTile w = decode_tile<Mode::kRoutedK>(p, tile, s_prefix, s_offset);
    const int col0 = (gather_a ? w.row0 : w.n_tile * BN) + 8 * chunk;
    const int cols = (gather_a ? p.M : p.N) - (col0 - 8 * chunk);
    int next = mine < w.k_len ? gather[w.k_off + mine] : -1;
    for (int k0 = 0; k0 < w.k_len; k0 += BK) {
      const int token = next;
      next = k0 + BK + mine < w.k_len ? gather[w.k_off + k0 + BK + mine] : -1;
      const bf16* rows[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tok = __shfl_sync(0xffffffffu, token, sub + 4 * i);
        rows[i] = tok >= 0 ? src + tok * ld + col0 : nullptr;
      }
      mbar_wait(&empty[pipe.stage], pipe.phase ^ 1);
      const uint32_t stage_a = sa + pipe.stage * Cfg::kStageBytesA;
      const uint32_t stage_b = sb + pipe.stage * Cfg::kStageBytesB;
      if (t == 0) {  // the operand in expert order: 64(mn) × 64(k) boxes at (column, position)
        const int pos = w.k_off + k0;
        if (gather_a) {
          mbar_arrive_expect_tx(&full[pipe.stage], Cfg::kStageBytesB);
#pragma unroll
          for (int j = 0; j < BN / 64; ++j)
            tma_load_2d(stage_b + j * 8192, &p.tmap_b, &full[pipe.stage], w.n_tile * BN + 64 * j,
                        pos);
        } else {
          mbar_arrive_expect_tx(&full[pipe.stage], Cfg::kStageBytesA);
#pragma unroll
          for (int j = 0; j < BM / 64; ++j)
            tma_load_2d(stage_a + j * 8192, &p.tmap_a, &full[pipe.stage], w.row0 + 64 * j, pos);
        }
      }
      if (gather_a)
        gathered_positions<BM / 64>(rows, src, cols, stage_a, first_line, chunk);
      else
        gathered_positions<BN / 64>(rows, src, cols, stage_b, first_line, chunk);
      mbar_arrive_cp_async(&full[pipe.stage]);
      pipe.advance();
    }
  }
}

// The producer role (warpgroup 0; thread t of 128): fills the ring stage by stage, waiting for a
// stage to be free (`empty`) and completing `full` by the copies' arrival. s_rows: Storage::rows.
template <Mode kMode, bool kTmaA, int kRing>
__device__ void producer(const GemmParams& p, const int* s_prefix, const int* s_offset,
                         int64_t* s_rows, TileRing& ring, uint64_t* full, uint64_t* empty,
                         uint32_t sa, uint32_t sb, int t) {
  using Cfg = WgmmaConfig<kMode, kTmaA, kRing>;
  using LA = typename Cfg::SmemLayoutA;
  constexpr int BN = Cfg::BN, BK = Cfg::BK, kStages = Cfg::kStages;
  const bf16* a = static_cast<const bf16*>(p.a);
  const int total = total_tiles<kMode>(p, s_prefix);
  const bool dynamic = kMode != Mode::kRoutedK && p.tile_counter != nullptr;
  PipelineState<kTileRing> walk;
  if constexpr (kTmaA) {
    int stage = 0, phase = 0;  // a PipelineState<kStages>
    // A is not gathered: both operands by TMA, one thread drives the ring. Rows past the
    // expert's count belong to the next expert (or past the allocation: zero-filled); their
    // accumulator rows are never stored.
    if (t != 0) return;
    for (int it = 0;; ++it) {
      const int tile = dynamic ? take_tile(ring, walk, p.tile_counter, total)
                               : static_cast<int>(blockIdx.x + it * gridDim.x);
      if (tile < 0 || tile >= total) break;
      const WorkTile w = decode_tile<kMode>(p, tile, s_prefix, s_offset);
      for (int k0 = 0; k0 < w.k_len; k0 += BK) {
        mbar_wait(&empty[stage], phase ^ 1);
        const uint32_t stage_a = sa + stage * Cfg::kStageBytesA;
        const uint32_t stage_b = sb + stage * Cfg::kStageBytesB;
        mbar_arrive_expect_tx(&full[stage], Cfg::kStageBytesA + Cfg::kStageBytesB);
        if constexpr (kMode == Mode::kRoutedK) {
          // 64(mn) × 64(k) boxes at (column, position); the consumers zero the rows past k_len.
          const int pos = w.k_off + k0;
#pragma unroll
          for (int j = 0; j < Cfg::BM / 64; ++j)
            tma_load_2d(stage_a + j * 8192, &p.tmap_a, &full[stage], w.row0 + 64 * j, pos);
#pragma unroll
          for (int j = 0; j < BN / 64; ++j)
            tma_load_2d(stage_b + j * 8192, &p.tmap_b, &full[stage], w.n_tile * BN + 64 * j, pos);
        } else {
          tma_load_2d(stage_a, &p.tmap_a, &full[stage], k0, w.row0);
          tma_weight_tile<kMode, BN>(p, w, k0, stage_b, &full[stage]);
        }
        // PipelineState::advance written out: through the struct, nvcc selects other (equivalent)
        // instructions for this single-thread loop, and tools/ptx_compare.py holds this kernel
        // to the PTX that ran on the GPU.
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
  } else if constexpr (kMode == Mode::kRoutedK) {
    wgrad_gathered_producer<Cfg>(p, s_prefix, s_offset, full, empty, sa, sb, t);
  } else {
    // A gathered (routed-M): 128 threads copy A, thread 0 issues B's TMA boxes.
    // The sources of a thread's 8 chunks are made once per tile (a stage adds k0 and issues):
    // read back from the row table and rebuilt in every stage, they made the producer's
    // per-stage work a chain of shared loads, compares and 64-bit adds per chunk.
    PipelineState<kStages> pipe;
    const int kc = (t & 7) * 8;  // this thread's 8 contiguous k of A
    for (int it = 0;; ++it) {
      const int tile = dynamic ? producer_tile(ring, walk, p.tile_counter, total, t)
                               : static_cast<int>(blockIdx.x + it * gridDim.x);
      if (tile < 0 || tile >= total) break;
      const WorkTile w = decode_tile<kMode>(p, tile, s_prefix, s_offset);
      producer_sync();  // the previous tile's offsets are no longer read
      const int pos = w.row0 + t;
      s_rows[t] = t < w.rows ? (p.a_gather ? (int64_t)p.a_gather[pos] : (int64_t)pos) * p.lda : -1;
      producer_sync();
      const bf16* a_src[8];  // chunk sources at k0 = 0 (nullptr: no row)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int64_t off = s_rows[(t >> 3) + 16 * i];
        a_src[i] = off >= 0 ? a + off + kc : nullptr;
      }
      for (int k0 = 0; k0 < w.k_len; k0 += BK) {
        mbar_wait(&empty[pipe.stage], pipe.phase ^ 1);
        const uint32_t stage_a = sa + pipe.stage * Cfg::kStageBytesA;
        const uint32_t stage_b = sb + pipe.stage * Cfg::kStageBytesB;
        const bool k_ok = k0 + kc < p.K;
#pragma unroll
        for (int i = 0; i < 8; ++i) {  // A: 128 rows × 8 chunks
          const bool ok = a_src[i] != nullptr && k_ok;
          cp_async_16(stage_a + swizzled<LA>((t >> 3) + 16 * i, kc), ok ? a_src[i] + k0 : a, ok);
        }
        if (t == 0) {
          mbar_arrive_expect_tx(&full[pipe.stage], Cfg::kStageBytesB);
          tma_weight_tile<kMode, BN>(p, w, k0, stage_b, &full[pipe.stage]);
        }
        mbar_arrive_cp_async(&full[pipe.stage]);
        pipe.advance();
      }
    }
  }
}

// The consumer role (warpgroups 1 and 2; thread t of 128 in warpgroup wg): per tile, wgmma over
// the ring's stages as they fill, each stage handed back (`empty`) once the next one's wgmma is
// issued; then the epilogue from the accumulators in registers (or through the staging area).
template <Mode kMode, Epi kEpi, bool kTmaA, bool kStagedOut>
__device__ __forceinline__ void consumer(const GemmParams& p, const int* s_prefix,
                                         const int* s_offset, cute::bfloat16_t* ring_a,
                                         cute::bfloat16_t* ring_b, TileRing& ring, uint64_t* full,
                                         uint64_t* empty, char* out_stage, int wg, int t) {
  using namespace cute;
  using Cfg = WgmmaConfig<kMode, kTmaA, kRingStages<kMode, kStagedOut>>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kStages = Cfg::kStages;
  Tensor sA = make_tensor(make_smem_ptr(ring_a), typename Cfg::SmemLayoutA{});  // (BM,BK,STAGES)
  Tensor sB = make_tensor(make_smem_ptr(ring_b), typename Cfg::SmemLayoutB{});  // (BN,BK,STAGES)
  typename Cfg::TiledMma mma;
  mma.accumulate_ = GMMA::ScaleOut::One;
  auto thr = mma.get_thread_slice(threadIdx.x - 128);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA,MMA_M,MMA_K,STAGES) descriptors
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));  // (MMA,MMA_N,MMA_K,STAGES)
  Tensor acc = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});  // (MMA,MMA_M,MMA_N) f32
  const int total = total_tiles<kMode>(p, s_prefix);
  // The SwiGLU epilogues keep the tile's last stage as their buffers (epilogue_staged.cuh);
  // routed-M tiles have K > 0, so there is always one.
  constexpr bool kHeld = kMode != Mode::kRoutedK &&
                         (kEpi == Epi::kSwiGLU || kEpi == Epi::kSwiGLUSave ||
                          kEpi == Epi::kStoreGLU || kEpi == Epi::kSwiGLUBwd || IsMxGlu(kEpi));
  PipelineState<kStages> pipe;
  const bool dynamic = kMode != Mode::kRoutedK && p.tile_counter != nullptr;
  PipelineState<kTileRing> walk;
  for (int it = 0;; ++it) {
    const int tile =
        dynamic ? next_tile(ring, walk) : static_cast<int>(blockIdx.x + it * gridDim.x);
    if (tile < 0 || tile >= total) break;
    const WorkTile w = decode_tile<kMode>(p, tile, s_prefix, s_offset);
    if constexpr (kEpi == Epi::kSwiGLUBwd) prefetch_h_to_l2<BN>(p, w, wg - 1, t);
    clear(acc);
    int prev = -1;
    for (int k0 = 0; k0 < w.k_len; k0 += BK) {
      mbar_wait(&full[pipe.stage], pipe.phase);
      // Routed-K: the expert's last k-block runs only the 16-position wgmma steps that hold one
      // of its positions (S2's experts end 1-16 positions into their fifth block), and zeroes
      // the rest of the last such step. The steps left out would add products of zeros only.
      int steps = BK / 16;
      if constexpr (kMode == Mode::kRoutedK) {
        const int valid = w.k_len - k0;
        if (valid < BK) {
          steps = (valid + 15) / 16;
          if (valid % 16 != 0)
            zero_tail_rows<BM / 64, BN / 64>(smem_u32(ring_a) + pipe.stage * Cfg::kStageBytesA,
                                             smem_u32(ring_b) + pipe.stage * Cfg::kStageBytesB,
                                             valid, 16 * steps, threadIdx.x - 128);
        }
      }
      fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads async
      warpgroup_fence_operand(acc);
      if (steps == BK / 16) {
        warpgroup_arrive();
        gemm(mma, tCrA(_, _, _, pipe.stage), tCrB(_, _, _, pipe.stage), acc);
        warpgroup_commit_batch();
        warpgroup_wait<1>();  // the previous stage's wgmma is done: hand its buffers back
      } else {
        // A tail block (routed-K), the tile's last: its first n steps as one straight-line batch
        // per n, waited for before the paths join (wgmmas still in flight where control flow
        // joins make ptxas serialize them, C7519); the tile waits for all of them anyway.
        auto first_steps = [&](auto n) {
          warpgroup_arrive();
#pragma unroll
          for (int j = 0; j < decltype(n)::value; ++j)
            gemm(mma, tCrA(_, _, j, pipe.stage), tCrB(_, _, j, pipe.stage), acc);
          warpgroup_commit_batch();
          warpgroup_wait<0>();
        };
        static_assert(BK / 16 == 4, "a tail block runs 1..3 steps");
        if (steps == 1)
          first_steps(Int<1>{});
        else if (steps == 2)
          first_steps(Int<2>{});
        else
          first_steps(Int<3>{});
      }
      warpgroup_fence_operand(acc);
      if (prev >= 0 && t == 0) mbar_arrive(&empty[prev]);
      prev = pipe.stage;
      pipe.advance();
    }
    warpgroup_wait<0>();
    if constexpr (kHeld) {
      static_assert(Cfg::kStageBytesA == 16384 && Cfg::kStageBytesB == 32768, "six 8 KB areas");
      consumer_sync();  // both warpgroups' wgmmas are done reading stage `prev`
      const uint32_t sa = smem_u32(ring_a) + prev * Cfg::kStageBytesA;
      const uint32_t sb = smem_u32(ring_b) + prev * Cfg::kStageBytesB;
      const EpiBuffers eb = held_buffers(sa, sb, sb + 16384, wg - 1);
      auto value = [&](int i) { return acc(i); };
      if constexpr (kEpi == Epi::kSwiGLUBwd)
        swiglu_bwd_staged<BN>(p, w, value, wg - 1, t, eb);
      else
        glu_staged<kEpi, BN>(p, w, value, wg - 1, t, eb);
      release_held_stage(&empty[prev], wg - 1, t);
      continue;
    }
    if (prev >= 0 && t == 0) mbar_arrive(&empty[prev]);
    if constexpr (kStagedOut) {
      constexpr bool kWhole = kWholeTileStaging<kMode, kStagedOut>;
      store_rows_staged<kEpi, BN, true, kWhole>(
          p, w, [&](int i) { return acc(i); }, wg - 1, t,
          smem_u32(out_stage) + (wg - 1) * (kStagingBytes<kMode, kStagedOut> / 2));
    } else if constexpr (!IsMxGlu(kEpi)) {  // (the mx epilogues are held: glu_staged)
      run_epilogue<bf16, kEpi, BN>(p, w, [&](int i) { return acc(i); }, wg - 1, t);
    }
  }
  if (kStagedOut && t == 0)
    bulk_wait<0, false>();  // the last boxes are written before the CTA ends
}

// The plain row outputs that may go out through the staging area (store_rows_staged).
template <Epi kEpi>
constexpr bool kStagedEpilogue =
    kEpi == Epi::kWeighted || kEpi == Epi::kStoreRows || kEpi == Epi::kStoreCast;

// The kernel lays out shared memory, initializes the barriers and picks each warpgroup's role.
template <Mode kMode, Epi kEpi, bool kTmaA, bool kStagedOut>
__global__ void __launch_bounds__(384, 1) wgmma_gemm_kernel(const __grid_constant__ GemmParams p) {
  static_assert(!kStagedOut || kStagedEpilogue<kEpi>, "staged stores: plain row outputs only");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kRing = kRingStages<kMode, kStagedOut>;
  using Cfg = WgmmaConfig<kMode, kTmaA, kRing>;
  using Storage = typename Cfg::Storage;
  constexpr int kStages = Cfg::kStages;
  extern __shared__ char smem_raw[];
  // The layout is Storage (pipeline.cuh) at the aligned base, then the two tables: each pointer
  // is the previous one plus the previous member's size, which the static_asserts of
  // WgmmaConfig tie to Storage's offsets.
  char* smem =
      smem_raw + ((kSmemAlign - (smem_u32(smem_raw) & (kSmemAlign - 1))) & (kSmemAlign - 1));
  auto* ring_a = reinterpret_cast<typename Cfg::Elem*>(smem);  // Storage::a
  auto* ring_b = reinterpret_cast<typename Cfg::Elem*>(smem + offsetof(Storage, b));
  auto* full = reinterpret_cast<uint64_t*>(smem + offsetof(Storage, full));
  uint64_t* empty = full + kStages;                                // Storage::empty
  int64_t* s_rows = reinterpret_cast<int64_t*>(empty + kStages);   // Storage::rows [BM]
  auto& ring = *reinterpret_cast<TileRing*>(s_rows + Cfg::BM);     // Storage::tiles
  int* s_prefix = reinterpret_cast<int*>(smem + sizeof(Storage));  // [E+1]
  int* s_offset = s_prefix + p.experts + 1;                        // [E+1]
  // [kStagingBytes] after the offsets (kStagedOut only), 1024-byte aligned in the shared
  // window: the TMA stores' 128B swizzle is a function of the address.
  const uint32_t tables_end = smem_u32(s_offset + p.experts + 1);
  char* out_stage = reinterpret_cast<char*>(s_offset + p.experts + 1) +
                    (((tables_end + kSmemAlign - 1) & ~uint32_t{kSmemAlign - 1}) - tables_end);

  for (int i = threadIdx.x; i <= p.experts; i += blockDim.x) {
    s_prefix[i] = p.mtile_prefix ? p.mtile_prefix[i] : 0;
    s_offset[i] = p.expert_offset[i];
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // every producer thread arrives once its copies land (+1: the TMA expect_tx arrival)
      mbar_init(&full[s], kTmaA ? 1 : 129);
      mbar_init(&empty[s], 2);  // one thread per consumer warpgroup
    }
    init_tile_ring(ring);
  }
  __syncthreads();

  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 72;\n");
    if (t == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.tmap_b) : "memory");
    if (kTmaA && t == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.tmap_a) : "memory");
    producer<kMode, kTmaA, kRing>(p, s_prefix, s_offset, s_rows, ring, full, empty,
                                  smem_u32(ring_a), smem_u32(ring_b), t);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\n");
    consumer<kMode, kEpi, kTmaA, kStagedOut>(p, s_prefix, s_offset, ring_a, ring_b, ring, full,
                                             empty, out_stage, wg, t);
  }
#endif
}

template <Mode kMode, Epi kEpi, bool kTmaA, bool kStagedOut>
cudaError_t launch_wgmma_gemm(const GemmParams& p, int num_sms, cudaStream_t stream) {
  using Cfg = WgmmaConfig<kMode, kTmaA, kRingStages<kMode, kStagedOut>>;
  const size_t smem = Cfg::Storage::dynamic_bytes(p.experts, kStagingBytes<kMode, kStagedOut>);
  auto* kernel = wgmma_gemm_kernel<kMode, kEpi, kTmaA, kStagedOut>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<num_sms, Cfg::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mok::cuda
