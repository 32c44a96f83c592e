// Phase "count → schedule": from topk_ids to a stable expert-sorted assignment list and tile
// prefixes, all on the device (no host sync).
//
// Order inside an expert is the flat assignment order (t * k + j), so the weight-gradient
// reductions over tokens run in a fixed order. Ranks come from warp-level __match_any_sync over
// fixed chunks, never from atomics whose order depends on scheduling.
#pragma once

#include "cuda/device/ptx.cuh"

namespace mok::cuda {

constexpr int kRouteChunk = 1024;  // assignments per warp in count/place
constexpr int kRouteWarps = 8;     // warps per block in count/place (at most: route_warps)
constexpr int kTileM = 128;        // rows per GEMM tile (both paths)

// Tile counters per call (Routing::tile_counters): the routed-M GEMMs of one forward or backward
// call (both kernels), each with its own.
constexpr int kTileCounters = 4;

struct Routing {
  const int* topk_ids;  // [T*k]
  int assignments;      // T*k
  int experts;          // E
  int chunks;           // ceil(T*k / kRouteChunk)
  int* chunk_counts;    // [chunks, E]: counts (route_count_kernel), then bases (route_scan)
  int* tile_counters;   // [kTileCounters] right after chunk_counts, zeroed by route_count_kernel:
                        // the routed-M GEMMs' dynamic tile order (GemmParams::tile_counter)
  int* expert_offset;   // [E+1] first sorted position of each expert; [E] = valid total
  int* mtile_prefix;    // [E+1] exclusive prefix of ceil(count_e / kTileM)
  int* sorted_token;    // [T*k] token of each sorted position
  int* sorted_slot;     // [T*k] assignment index t*k+j of each sorted position
  int* assign_pos;      // [T*k] sorted position of each assignment, -1 when skipped
  int top_k;
};

// One warp walks one chunk in rounds of 32; `visit(idx, e, rank_in_chunk)` sees each valid
// assignment with its stable rank among the chunk's assignments of expert e, `skip(idx)` each
// skipped one (an id outside [0, E)). `counter` is the warp's own [E] running counts in shared
// memory. The lane's ids of every round are loaded before the first round, so the rounds wait
// on shared memory only, not on one global load each.
template <class Visit, class Skip>
__device__ __forceinline__ void walk_chunk(const Routing& r, int chunk, int* counter, Visit visit,
                                           Skip skip) {
  constexpr int kRounds = kRouteChunk / 32;
  const int lane = threadIdx.x & 31;
  const int begin = chunk * kRouteChunk;
  const int end = min(begin + kRouteChunk, r.assignments);
  int ids[kRounds];
#pragma unroll
  for (int j = 0; j < kRounds; ++j) {
    const int idx = begin + 32 * j + lane;
    ids[j] = idx < end ? r.topk_ids[idx] : -1;
  }
#pragma unroll
  for (int j = 0; j < kRounds; ++j) {
    const int idx = begin + 32 * j + lane;
    int e = ids[j];
    const bool valid = idx < end && e >= 0 && e < r.experts;
    if (!valid) {
      if (idx < end) skip(idx);
      e = -1;
    }
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int leader = __ffs(peers) - 1;
    const int before = __popc(peers & ((1u << lane) - 1u));
    int seen = 0;
    if (valid) seen = counter[e];
    __syncwarp();
    if (valid) {
      visit(idx, e, seen + before);
      if (lane == leader) counter[e] = seen + __popc(peers);
    }
    __syncwarp();
  }
}

// Warps per block of the count and place kernels and their shared memory: each warp holds [E]
// ints; fewer warps per block where E is large, so that a block fits 48 KB without an opt-in
// up to E = 12288 (the routed GEMMs hold E-sized tables in their own shared memory too).
constexpr int kRouteSmemBudget = 48 * 1024;
inline int route_warps(int experts) {
  const int fit = kRouteSmemBudget / (static_cast<int>(sizeof(int)) * experts);
  return fit < 1 ? 1 : (fit < kRouteWarps ? fit : kRouteWarps);
}

// Per (chunk, expert) counts, written whole (no zeroed buffer needed); block 0 also zeroes the
// GEMMs' tile counters, which follow chunk_counts.
static __global__ void route_count_kernel(Routing r) {
  extern __shared__ int s_counter[];  // [warps][E]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (blockIdx.x == 0 && threadIdx.x < kTileCounters) r.tile_counters[threadIdx.x] = 0;
  const int chunk = blockIdx.x * (blockDim.x >> 5) + warp;
  if (chunk >= r.chunks) return;  // a whole warp; no block-wide barrier follows
  int* counter = s_counter + warp * r.experts;
  for (int e = lane; e < r.experts; e += 32) counter[e] = 0;
  __syncwarp();
  walk_chunk(r, chunk, counter, [](int, int, int) {}, [](int) {});
  __syncwarp();
  int* out = r.chunk_counts + static_cast<int64_t>(chunk) * r.experts;
  for (int e = lane; e < r.experts; e += 32) out[e] = counter[e];
}

// One block: per-expert totals, expert offsets, m-tile prefix, and each chunk's base position
// per expert (overwrites chunk_counts with bases).
static __global__ void route_scan_kernel(Routing r) {
  __shared__ int carry_pos, carry_tiles;
  if (threadIdx.x == 0) carry_pos = carry_tiles = 0;
  __syncthreads();
  for (int e0 = 0; e0 < r.experts; e0 += blockDim.x) {
    const int e = e0 + threadIdx.x;
    int count = 0;
    if (e < r.experts)
      for (int c = 0; c < r.chunks; ++c)
        count += r.chunk_counts[static_cast<int64_t>(c) * r.experts + e];
    // Block-wide exclusive scan of (count, tiles), packed as two 32-bit lanes of one int64.
    const int tiles = (count + kTileM - 1) / kTileM;
    long long v = (static_cast<long long>(tiles) << 32) | static_cast<unsigned>(count);
    long long inc = v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int d = 1; d < 32; d <<= 1) {
      long long o = __shfl_up_sync(0xffffffffu, inc, d);
      if (lane >= d) inc += o;
    }
    __shared__ long long wsum[32];
    if (lane == 31) wsum[warp] = inc;
    __syncthreads();
    if (warp == 0) {
      long long s = lane < (blockDim.x >> 5) ? wsum[lane] : 0;
      for (int d = 1; d < 32; d <<= 1) {
        long long o = __shfl_up_sync(0xffffffffu, s, d);
        if (lane >= d) s += o;
      }
      wsum[lane] = s;
    }
    __syncthreads();
    const long long excl = inc - v + (warp > 0 ? wsum[warp - 1] : 0);
    const int pos = carry_pos + static_cast<int>(excl & 0xffffffffLL);
    const int tile = carry_tiles + static_cast<int>(excl >> 32);
    if (e < r.experts) {
      r.expert_offset[e] = pos;
      r.mtile_prefix[e] = tile;
      int base = pos;
      for (int c = 0; c < r.chunks; ++c) {
        int* cell = r.chunk_counts + static_cast<int64_t>(c) * r.experts + e;
        const int n = *cell;
        *cell = base;
        base += n;
      }
    }
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) {
      carry_pos = pos + count;
      carry_tiles = tile + tiles;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    r.expert_offset[r.experts] = carry_pos;
    r.mtile_prefix[r.experts] = carry_tiles;
  }
}

// Writes the sorted list (chunk_counts holds each chunk's bases after route_scan_kernel), and
// -1 as the position of every skipped assignment (an id outside [0, E)).
static __global__ void route_place_kernel(Routing r) {
  extern __shared__ int s_counter[];  // [warps][E]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int chunk = blockIdx.x * (blockDim.x >> 5) + warp;
  if (chunk >= r.chunks) return;
  int* counter = s_counter + warp * r.experts;
  const int* bases = r.chunk_counts + static_cast<int64_t>(chunk) * r.experts;
  for (int e = lane; e < r.experts; e += 32) counter[e] = bases[e];
  __syncwarp();
  walk_chunk(
      r, chunk, counter,
      [&](int idx, int, int pos) {
        r.sorted_token[pos] = idx / r.top_k;
        r.sorted_slot[pos] = idx;
        r.assign_pos[idx] = pos;
      },
      [&](int idx) { r.assign_pos[idx] = -1; });
}

inline cudaError_t build_routing(const Routing& r, cudaStream_t stream) {
  const int warps = route_warps(r.experts);
  const size_t smem = sizeof(int) * static_cast<size_t>(warps) * r.experts;
  if (smem > kRouteSmemBudget) {  // E > 12288: one warp a block, with the opt-in
    for (auto* kernel : {route_count_kernel, route_place_kernel}) {
      const cudaError_t err = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess) return err;
    }
  }
  const int blocks = (r.chunks + warps - 1) / warps;
  route_count_kernel<<<blocks, 32 * warps, smem, stream>>>(r);
  route_scan_kernel<<<1, 1024, 0, stream>>>(r);
  route_place_kernel<<<blocks, 32 * warps, smem, stream>>>(r);
  return cudaGetLastError();
}

// ------------------------------------------------------------------ tile decoding
// Routed-M GEMMs: tiles of expert e are (n-tile major, m-tile minor) so that CTAs running at
// the same time share one weight column block and the expert's rows stay in L2.
struct RoutedTile {
  int expert, row0, rows, n_tile;  // rows = valid rows in this tile (1..kTileM)
};

// `prefix` = mtile_prefix (in shared memory), n_tiles = output tiles along N.
__device__ __forceinline__ RoutedTile decode_routed_tile(int tile, const int* prefix,
                                                         const int* offset, int experts,
                                                         int n_tiles) {
  // Largest e with prefix[e] * n_tiles <= tile (binary search over E+1 entries).
  int lo = 0, hi = experts;  // invariant: prefix[lo]*n <= tile < prefix[hi]*n
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (prefix[mid] * n_tiles <= tile)
      lo = mid;
    else
      hi = mid;
  }
  const int m_tiles = prefix[lo + 1] - prefix[lo];
  const int local = tile - prefix[lo] * n_tiles;
  RoutedTile t;
  t.expert = lo;
  t.n_tile = local / m_tiles;
  const int m_tile = local - t.n_tile * m_tiles;
  t.row0 = offset[lo] + m_tile * kTileM;
  t.rows = min(kTileM, offset[lo + 1] - t.row0);
  return t;
}

}  // namespace mok::cuda
