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
constexpr int kRouteWarps = 8;     // warps per block in count/place
constexpr int kTileM = 128;        // rows per GEMM tile (both paths)

// Tile counters per call (Routing::tile_counters): the routed-M GEMMs of one forward or backward
// call (both kernels), each with its own.
constexpr int kTileCounters = 4;

struct Routing {
  const int* topk_ids;  // [T*k]
  int assignments;      // T*k
  int experts;          // E
  int chunks;           // ceil(T*k / kRouteChunk)
  int* chunk_counts;    // [chunks, E] (zeroed before count)
  int* tile_counters;   // [kTileCounters] right after chunk_counts, zeroed with it: the routed-M
                        // GEMMs' dynamic tile order (GemmParams::tile_counter), one per GEMM
  int* expert_offset;   // [E+1] first sorted position of each expert; [E] = valid total
  int* mtile_prefix;    // [E+1] exclusive prefix of ceil(count_e / kTileM)
  int* sorted_token;    // [T*k] token of each sorted position
  int* sorted_slot;     // [T*k] assignment index t*k+j of each sorted position
  int* assign_pos;      // [T*k] sorted position of each assignment, -1 when skipped
  int top_k;
};

// One warp walks one chunk in rounds of 32; `visit(idx, e, rank_in_chunk)` sees each valid
// assignment with its stable rank among the chunk's assignments of expert e.
template <class Visit>
__device__ __forceinline__ void walk_chunk(const Routing& r, int chunk, int* counter, Visit visit) {
  const int lane = threadIdx.x & 31;
  const int begin = chunk * kRouteChunk;
  const int end = min(begin + kRouteChunk, r.assignments);
  for (int base = begin; base < end; base += 32) {
    const int idx = base + lane;
    int e = idx < end ? r.topk_ids[idx] : -1;
    const bool valid = e >= 0 && e < r.experts;
    if (!valid) e = -1;
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

// counts per (chunk, expert)
static __global__ void route_count_kernel(Routing r) {
  const int chunk = blockIdx.x * kRouteWarps + (threadIdx.x >> 5);
  if (chunk >= r.chunks) return;
  walk_chunk(r, chunk, r.chunk_counts + static_cast<int64_t>(chunk) * r.experts,
             [](int, int, int) {});
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

// Writes the sorted list; chunk_counts holds bases after route_scan_kernel.
static __global__ void route_place_kernel(Routing r) {
  const int chunk = blockIdx.x * kRouteWarps + (threadIdx.x >> 5);
  if (chunk >= r.chunks) return;
  walk_chunk(r, chunk, r.chunk_counts + static_cast<int64_t>(chunk) * r.experts,
             [&](int idx, int, int pos) {
               r.sorted_token[pos] = idx / r.top_k;
               r.sorted_slot[pos] = idx;
               r.assign_pos[idx] = pos;
             });
}

static __global__ void route_mark_skipped_kernel(Routing r) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= r.assignments) return;
  const int e = r.topk_ids[idx];
  if (e < 0 || e >= r.experts) r.assign_pos[idx] = -1;
}

inline cudaError_t build_routing(const Routing& r, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(
      r.chunk_counts, 0, sizeof(int) * (static_cast<size_t>(r.chunks) * r.experts + kTileCounters),
      stream);
  if (err != cudaSuccess) return err;
  const int blocks = (r.chunks + kRouteWarps - 1) / kRouteWarps;
  route_count_kernel<<<blocks, 32 * kRouteWarps, 0, stream>>>(r);
  route_scan_kernel<<<1, 1024, 0, stream>>>(r);
  route_place_kernel<<<blocks, 32 * kRouteWarps, 0, stream>>>(r);
  route_mark_skipped_kernel<<<(r.assignments + 255) / 256, 256, 0, stream>>>(r);
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
