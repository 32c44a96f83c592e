// The wgmma GEMM's pipeline (mainloop_sm90.cuh): the shared-memory storage of its stage ring and
// the (stage, phase) walk over the ring that producer and consumers share. No CUTLASS here: the
// host sizes the kernel's shared memory from SharedStorage (host/plan.h, launch_wgmma_gemm).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/device/gemm_params.cuh"

namespace mok::cuda {

constexpr int kWgmmaBK = 64;     // K per stage
constexpr int kWgmmaStages = 4;  // stages in the ring

// Bytes of the optional output staging area: 64 rows × 64 columns of bf16 per consumer warpgroup.
constexpr int kOutStageBytes = 2 * 64 * 64 * 2;

// The weight-gradient (routed-K) kernels with staged stores hold a whole 128 × 256 bf16 output
// tile in their staging area and keep one ring stage fewer: 3 × 48 KB + 64 KB = 4 × 48 KB + 16 KB,
// so they fit wherever the other staged kernels do (plan.h checks those; two ring barriers fewer
// make them 16 bytes smaller). Their tiles have short K wherever experts get few positions (S2:
// 256, 4 stages), so the epilogue's stores are a large part of a tile; with the whole tile
// staged, the stores of one tile drain during the next tile's mainloop instead of each 64-column
// pass waiting for the previous pass's box to leave the buffer.
template <Mode kMode, bool kStaged>
constexpr bool kWholeTileStaging = kMode == Mode::kRoutedK && kStaged;
template <Mode kMode, bool kStaged>
constexpr int kRingStages = kWholeTileStaging<kMode, kStaged> ? kWgmmaStages - 1 : kWgmmaStages;
template <Mode kMode, bool kStaged>
constexpr int kStagingBytes = !kStaged                            ? 0
                              : kWholeTileStaging<kMode, kStaged> ? kTileM * kWgmmaBN * 2
                                                                  : kOutStageBytes;

// The kernel aligns its dynamic shared memory up to this: the period of the 128B swizzle.
constexpr int kSmemAlign = 1024;

// Position in a ring of kStages buffers guarded by mbarriers: the stage to use next and the
// parity of the barrier phase that stage is in (it flips each time the walk wraps around).
template <int kStages>
struct PipelineState {
  int stage = 0, phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
};

// The dynamic tile order (GemmParams::tile_counter): the producer's first thread takes each tile
// id from the counter and hands it to the consumers through this ring of ids (-1: no tile left);
// mainloop_sm90.cuh: take_tile, next_tile.
constexpr int kTileRing = 8;
struct TileRing {
  uint64_t full[kTileRing];   // slot s holds an id (the producer's first thread)
  uint64_t empty[kTileRing];  // every consumer thread has read slot s
  int id[kTileRing];
  int current;  // the producer's current id, for its other threads
};

// The fixed head of the wgmma kernel's dynamic shared memory, at the 1024-aligned base. After it
// come the per-call tables and, with staged stores, the staging area:
//   SharedStorage | mtile prefix [E+1] i32 | expert offset [E+1] i32 | (1024-aligned) staging
template <int BM, int BN, int BK, int kStages>
struct SharedStorage {
  static constexpr int kStageBytesA = BM * BK * 2, kStageBytesB = BN * BK * 2;  // bf16
  uint16_t a[kStages][BM * BK];  // (BM,BK,STAGES) bf16, 128B-swizzled (SmemLayoutA)
  uint16_t b[kStages][BN * BK];  // (BN,BK,STAGES) bf16, 128B-swizzled (SmemLayoutB)
  uint64_t full[kStages];        // mbarrier: stage s holds data (producer -> consumers)
  uint64_t empty[kStages];       // mbarrier: stage s is free again (consumers -> producer)
  int64_t rows[BM];              // producer: element offsets of the current tile's A rows
  TileRing tiles;                // routed-M with a tile counter

  // Dynamic shared memory of one launch: alignment slack, this head, the two tables, staging.
  static constexpr size_t dynamic_bytes(int experts, int staging_bytes) {
    return kSmemAlign + sizeof(SharedStorage) + 2 * sizeof(int) * (experts + 1) +
           (staging_bytes > 0 ? kSmemAlign + staging_bytes : 0);
  }
};

using WgmmaStorage = SharedStorage<kTileM, kWgmmaBN, kWgmmaBK, kWgmmaStages>;
static_assert(sizeof(WgmmaStorage::a[0]) % kSmemAlign == 0 &&
                  sizeof(WgmmaStorage::b[0]) % kSmemAlign == 0,
              "every stage of both rings starts on a swizzle period");
static_assert(offsetof(WgmmaStorage, full) ==
                  kWgmmaStages * (WgmmaStorage::kStageBytesA + WgmmaStorage::kStageBytesB),
              "the barriers follow the rings without padding");
static_assert(sizeof(WgmmaStorage) % alignof(int) == 0, "the tables follow the head");
static_assert(
    SharedStorage<kTileM, kWgmmaBN, kWgmmaBK, kRingStages<Mode::kRoutedK, true>>::dynamic_bytes(
        1, kStagingBytes<Mode::kRoutedK, true>) <= WgmmaStorage::dynamic_bytes(1, kOutStageBytes),
    "every staged kernel fits where plan.h's check says the staged kernels fit");

}  // namespace mok::cuda
