// Two-CTA clusters ("pairs") for the persistent grouped GEMMs. The two CTAs of a cluster work on
// m-tiles 2j and 2j + 1 of the same (expert, n-tile), so they read the same weight tile B: each
// CTA loads one half of B by TMA multicast into both CTAs' shared memory, and B's L2 reads per
// tile halve. (A tile of 128 x 256 reads 128 rows of A and 256 of B per K: a third fewer L2 bytes
// per FLOP, the limit of the FP8 mainloop on S2 in docs/perf-notes.md.)
//
// Invariants a paired kernel keeps:
//   - Both CTAs walk the same sequence of pair tiles and the same K loop, so their stage rings
//     stay in step: stage s of one holds the same k-block as stage s of the other.
//   - A stage is refilled only when the consumers of both CTAs have released it: each consumer
//     warpgroup arrives on the `empty` barrier of both CTAs (count 2 x 2), since either CTA's
//     producer writes into both shared memories. These arrivals publish nothing (the wgmmas'
//     reads are complete), so they and the producer's wait on `empty` stay at CTA scope.
//   - A CTA whose tile has no rows (WorkTile::rows == 0: an expert-K pair's missing m-tile, the
//     idle rank of a routed-M single pair on an odd n-tile count; see the pair schedule below)
//     still runs the K loop, loading its share of B and handing every stage back, with no
//     epilogue.
//   - Dynamic tile order (TileRing): rank 0's producer takes each pair id from the counter and
//     writes it into both CTAs' rings; every reader of either ring (the consumer warps of both
//     CTAs and rank 1's producer) arrives on rank 0's `empty` slot, so rank 0 overwrites a slot
//     of rank 1 only after rank 1 has read it.
//   - No CTA exits while its partner may still write its shared memory or arrive on its barriers:
//     the kernel ends with a cluster barrier.
#pragma once

#include <algorithm>
#include <cstdio>

#include "cuda/device/pipeline.cuh"
#include "cuda/device/ptx.cuh"

namespace mok::cuda {

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The shared::cluster address of this CTA's shared-memory word `local` in the CTA of `rank`.
__device__ __forceinline__ uint32_t cluster_smem(uint32_t local, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(local), "r"(rank));
  return r;
}

// Arrival on an mbarrier of any CTA of the cluster, releasing this thread's prior writes at
// cluster scope.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr)
               : "memory");
}

// Arrival on an mbarrier of any CTA of the cluster that publishes nothing: a consumer handing a
// stage back (its wgmmas have finished reading it: warpgroup_wait), a reader of the tile ring
// freeing a slot it has read. The default .release.cta semantics; the cluster-scope release
// above compiles to MEMBAR.ALL.GPU before the arrive (and its acquire to an L1 invalidation
// after the wait), which per stage made the paired GEMMs 1.4-2.1x slower than unpaired ones.
__device__ __forceinline__ void mbar_arrive_remote(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr) : "memory");
}

// mbar_wait for a barrier that another CTA arrives on after publishing data in this CTA's shared
// memory (the tile ring's ids): acquires at cluster scope. A stage's `empty` barrier, whose
// remote arrivals publish nothing, is waited on with mbar_wait.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, int parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], "
        "%2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void st_cluster_u32(uint32_t cluster_addr, uint32_t v) {
  asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(cluster_addr), "r"(v) : "memory");
}

// Makes this thread's mbarrier.init visible to the other CTAs of the cluster (before the cluster
// barrier that lets them arrive on it).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Every thread of every CTA of the cluster (not .aligned: called after divergent roles).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// tma_load_3d into the same shared-memory offset of every CTA in `cta_mask`, each CTA's barrier
// at `bar`'s offset receiving the bytes that land in it.
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const void* tensor_map,
                                                      uint64_t* bar, int c0, int c1, int c2,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(tensor_map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
}

// ------------------------------------------------------------------ the pair tile ring
// Arrivals that free a slot of rank 0's ring: each consumer warp of both CTAs, and rank 1's
// producer thread that relays the id to its own producer warpgroup.
constexpr int kPairRingReaders = 2 * 8 + 1;

__device__ __forceinline__ void init_pair_tile_ring(TileRing& r) {
  for (int i = 0; i < kTileRing; ++i) {
    mbar_init(&r.full[i], 1);                  // rank 0's producer thread, in both CTAs
    mbar_init(&r.empty[i], kPairRingReaders);  // read on rank 0 only
  }
}

// Rank 0's producer thread 0: the next pair id (-1 past `total`) into both CTAs' slot.
__device__ __forceinline__ int pair_take_tile(TileRing& r, PipelineState<kTileRing>& walk,
                                              int* counter, int total) {
  mbar_wait_cluster(&r.empty[walk.stage], walk.phase ^ 1);
  int id = atomicAdd(counter, 1);
  if (id >= total) id = -1;
  r.id[walk.stage] = id;
  st_cluster_u32(cluster_smem(smem_u32(&r.id[walk.stage]), 1), static_cast<uint32_t>(id));
  mbar_arrive(&r.full[walk.stage]);
  mbar_arrive_cluster(cluster_smem(smem_u32(&r.full[walk.stage]), 1));  // releases the store
  r.current = id;
  walk.advance();
  return id;
}

// Rank 1's producer thread 0: the id rank 0 wrote, for its producer warpgroup (`current`).
__device__ __forceinline__ int pair_receive_tile(TileRing& r, PipelineState<kTileRing>& walk) {
  mbar_wait_cluster(&r.full[walk.stage], walk.phase);
  const int id = *reinterpret_cast<volatile int*>(&r.id[walk.stage]);
  mbar_arrive_remote(cluster_smem(smem_u32(&r.empty[walk.stage]), 0));
  r.current = id;
  walk.advance();
  return id;
}

// A consumer thread of either CTA: the next pair id. Lane 0 of each warp waits (one cluster-scope
// acquire a warp, not a thread), reads the id, hands it to its lanes and frees the slot: one
// arrival per warp.
__device__ __forceinline__ int pair_next_tile(TileRing& r, PipelineState<kTileRing>& walk) {
  int id = 0;
  if ((threadIdx.x & 31) == 0) {
    mbar_wait_cluster(&r.full[walk.stage], walk.phase);
    id = *reinterpret_cast<volatile int*>(&r.id[walk.stage]);
    mbar_arrive_remote(cluster_smem(smem_u32(&r.empty[walk.stage]), 0));
  }
  id = __shfl_sync(0xffffffffu, id, 0);
  walk.advance();
  return id;
}

// The producer warpgroup's threads (t of 128): the pair id, through `current` after a producer
// barrier (bar.sync 1, 128), as producer_tile (mainloop_sm90.cuh).
__device__ __forceinline__ int pair_producer_tile(TileRing& r, PipelineState<kTileRing>& walk,
                                                  int* counter, int total, int t, uint32_t rank) {
  if (t == 0) {
    if (rank == 0)
      pair_take_tile(r, walk, counter, total);
    else
      pair_receive_tile(r, walk);
  }
  asm volatile("bar.sync 1, 128;\n" ::: "memory");
  return *reinterpret_cast<volatile int*>(&r.current);
}

// ------------------------------------------------------------------ the pair schedule
// Routed-M, expert by expert, so that a weight tile's readers run together (its L2 reuse, as in
// the single-CTA order (expert, n-tile, m-tile)). An expert with m m-tiles has p = floor(m / 2)
// shared pairs per n-tile (m-tiles 2j, 2j + 1: one B, multicast) and, for odd m, its last m-tile
// as a single for every n-tile: two singles of n-tiles 2g, 2g + 1 make a pair, each CTA loading
// its own B (one expert: the same K). Pair ids, per expert, in groups g of n-tiles 2g, 2g + 1:
// the shared pairs of n-tile 2g (j = 0..p-1), of n-tile 2g + 1, then the single pair; an odd
// n-tile count leaves the last group one n-tile, its single pair's rank 1 idle (rows == 0).
// (Pairing the singles of different experts instead, numbered after every shared pair, re-read
// half of S2's weights from DRAM: docs/perf-notes.md.) The kernel's prefix table is the
// exclusive prefix of pair_tiles over the experts.
__host__ __device__ __forceinline__ int pair_tiles(int m_tiles, int n_tiles) {
  return (m_tiles >> 1) * n_tiles + (m_tiles & 1) * ((n_tiles + 1) >> 1);
}

// Warp 0 builds the pair prefix from the routing's m-tile prefix (read from global memory, so
// that no lane reads a table entry another lane overwrites).
__device__ __forceinline__ void pair_prefix(const int* mtile_prefix, int experts, int n_tiles,
                                            int* out, int lane) {
  auto tiles = [&](int e) { return pair_tiles(mtile_prefix[e + 1] - mtile_prefix[e], n_tiles); };
  const int chunk = (experts + 31) / 32;
  const int lo = min(experts, lane * chunk), hi = min(experts, lo + chunk);
  int sum = 0;
  for (int e = lo; e < hi; ++e) sum += tiles(e);
  int incl = sum;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  int base = incl - sum;
  for (int e = lo; e < hi; ++e) {
    out[e] = base;
    base += tiles(e);
  }
  if (lane == 31) out[experts] = incl;
}

// (Host and device: tests/cuda/pair_schedule_test.cu checks the schedule on the CPU.)
template <class Params>
__host__ __device__ __forceinline__ int pair_total_tiles(const Params& p, const int* s_prefix) {
  return s_prefix[p.experts];
}

// Largest e in [0, experts) with key(e) <= v, where key(0) <= v < key(experts) and key is
// non-decreasing.
template <class Key>
__host__ __device__ __forceinline__ int last_at_or_below(Key key, int experts, int v) {
  int lo = 0, hi = experts;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (key(mid) <= v)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// Pair tile `tile` for this rank; `shared`: both CTAs work on one B (loaded half each, multicast),
// else each loads its own.
template <class Params>
__host__ __device__ __forceinline__ WorkTile decode_pair_routed(const Params& p, int tile,
                                                                const int* s_prefix,
                                                                const int* s_offset, uint32_t rank,
                                                                bool& shared) {
  const int n = p.n_tiles;
  const int e = last_at_or_below([&](int i) { return s_prefix[i]; }, p.experts, tile);
  const int count = s_offset[e + 1] - s_offset[e];
  const int m = (count + kTileM - 1) / kTileM, pairs = m >> 1;
  const int group = 2 * pairs + (m & 1);  // ids of a two-n-tile group
  const int local = tile - s_prefix[e], g = local / group, r = local - g * group;
  const int in_group = min(2, n - 2 * g);  // n-tiles in group g
  WorkTile w;
  w.expert = e;
  w.k_off = 0;
  w.k_len = p.K;
  shared = r < in_group * pairs;
  if (shared) {
    const int h = r / pairs, j = r - h * pairs;
    w.n_tile = 2 * g + h;
    w.row0 = s_offset[e] + (2 * j + static_cast<int>(rank)) * kTileM;
  } else {  // the single pair: the last m-tile on n-tiles 2g, 2g + 1
    w.n_tile = 2 * g + static_cast<int>(rank);
    w.row0 = s_offset[e] + (m - 1) * kTileM;
    if (w.n_tile >= n) {  // no second n-tile: rank 1 idles on rank 0's (rows == 0)
      w.n_tile = 2 * g;
      w.row0 = s_offset[e + 1];
    }
  }
  w.rows = max(0, min(kTileM, s_offset[e + 1] - w.row0));
  return w;
}

// A persistent launch of `kKernel` in clusters of `kCtas` (x): as many clusters as can be
// resident at once (a GPC with an odd count of free SMs leaves one SM idle), at most the SMs'.
// The resident count is asked once per kernel (one CTA per SM whatever its table sizes).
template <auto kKernel, int kCtas, class Params>
cudaError_t launch_clusters(const Params& p, int threads, size_t smem, int num_sms,
                            cudaStream_t stream) {
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kCtas;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &cluster;
  cfg.numAttrs = 1;
  static const int resident = [&] {
    cfg.gridDim = dim3(num_sms / kCtas * kCtas);
    int clusters = 0;
    return cudaOccupancyMaxActiveClusters(&clusters, kKernel, &cfg) == cudaSuccess ? clusters : 0;
  }();
  if (resident < 1) return cudaErrorInvalidConfiguration;
  // Fewer resident clusters than the SMs allow leaves SMs idle for the whole launch: said once, on
  // stderr, so that a run's log shows it.
  static const bool said = [&] {
    if (kCtas * resident < num_sms - (kCtas - 1))
      std::fprintf(stderr, "jax_mok: a %d-CTA cluster launch holds %d of %d SMs\n", kCtas,
                   kCtas * resident, num_sms);
    return true;
  }();
  (void)said;
  cfg.gridDim = dim3(kCtas * std::min(resident, num_sms / kCtas));
  return cudaLaunchKernelEx(&cfg, kKernel, p);
}

}  // namespace mok::cuda
