// The peer-transport exchange kernel (docs/peer-transport.md): one launch per exchange.
//   1. push   : every CTA stores its share of my chunk d into rank d's receive slot (source =
//               me) with 16-byte stores over NVLink: in the staged calls' area of half
//               epoch & 1, or in the fused forward's fixed areas (Exchange::area);
//   2. signal : the last CTA to finish pushing stores arrival[me] = epoch into every peer
//               (st.release.sys), after __threadfence_system() by every pushing thread;
//   3. wait   : thread 0 of every CTA waits (bounded) for arrival[s] >= epoch from every peer;
//   4. read   : copy-out mode (staged dispatch) copies the receive slots into XLA's outputs;
//               reduce mode (combine) reduces the rows of every token over the ranks in
//               ascending order (float32); in-place mode (the fused forward's dispatch) leaves
//               the rows where they landed, for the expert GEMMs that follow in the same call;
//   5. finish : the last CTA to finish reading stores epoch, so the next call uses epoch + 1.
// Co-residency: the grid is at most ctas_per_sm (<= 4) x SMs CTAs of kThreads threads
// (host/peer_call.cu): a CTA spinning on a peer's flag never keeps a CTA of its own grid, whose
// stores that peer may wait for, from being scheduled.
//
// Ordering (docs/peer-transport.md, "Memory ordering and epochs"): data stores, then a system-scope
// release store of the flag; waiters use acquire loads; every wait is bounded (%globaltimer) and a
// peer that does not arrive becomes an error code in the workspace's error word, naming it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/device/ptx.cuh"
#include "cuda/host/symmetric.h"

namespace mok::cuda::ep {

// Which exchange a call is, for error messages: a missing peer is named with its phase.
enum Phase : int {
  kDispatch = 0,
  kCombine = 1,
  kReverseDispatch = 2,
  kReverseCombine = 3,
  kEpochCheck = 4
};

inline const char* PhaseName(int phase) {
  switch (phase) {
    case kDispatch:
      return "dispatch";
    case kCombine:
      return "combine";
    case kReverseDispatch:
      return "reverse dispatch (backward)";
    case kReverseCombine:
      return "reverse combine (backward)";
    case kEpochCheck:
      return "epoch check";
    default:
      return "unknown";
  }
}

// The error word: 0 = fine, else 1 + phase * 256 + the peer that did not arrive.
__host__ __device__ constexpr unsigned int ErrorCode(int phase, int peer) {
  return 1u + static_cast<unsigned int>(phase) * 256u + static_cast<unsigned int>(peer);
}

#ifdef __CUDACC__
__device__ __forceinline__ void store_release_sys(unsigned long long* flag,
                                                  unsigned long long value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

__device__ __forceinline__ unsigned long long load_acquire_sys(const unsigned long long* flag) {
  unsigned long long value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(flag) : "memory");
  return value;
}

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins until *flag >= target. Returns false once `deadline_ns` (a %globaltimer value) passes,
// or when another CTA has already written the error word (then nobody waits a second timeout).
__device__ inline bool wait_flag(const unsigned long long* flag, unsigned long long target,
                                 unsigned long long deadline_ns,
                                 const volatile unsigned int* error) {
  unsigned int spins = 0;
  while (load_acquire_sys(flag) < target) {
    if ((++spins & 127u) == 0) {
      if (*error != 0u) return false;
      if (global_timer_ns() > deadline_ns) return false;
    }
    __nanosleep(32);
  }
  return true;
}

// First error wins (a plain store: the word lives in mapped host memory, where device atomics
// are not guaranteed; any non-zero code is a valid report).
__device__ inline void report_error(volatile unsigned int* error, unsigned int code) {
  if (*error == 0u) *error = code;
  __threadfence_system();
}
#endif  // __CUDACC__

constexpr int kThreads = 256;
constexpr int kMaxFields = 3;

// What a kernel does with the received slots (step 4).
enum ExchangeMode : int { kCopyOut = 0, kReduce = 1, kInPlace = 2 };

// One array exchanged chunk by chunk: src/dst are [EP, chunk_bytes] (XLA buffers). The slot of
// source s on rank o is peers[o] + area + offset + s * stride.
struct Field {
  const char* src = nullptr;
  char* dst = nullptr;      // copy-out mode only
  int64_t chunk_bytes = 0;  // bytes of one (source, destination) chunk, a multiple of 4
  int64_t offset = 0;       // where the field starts inside the area (16-byte aligned)
  int64_t stride = 0;       // bytes from one source's slot to the next (>= chunk_bytes)
};

struct Exchange {
  Field field[kMaxFields];
  int num_fields = 0;
  int rank = 0, ep = 0, phase = 0;
  // Every store of step 1 (and my own chunk's copy) done before the launch by copy-engine copies
  // on the same stream (the call's copy_engine attribute): the kernel only signals, waits, reads.
  bool pushed = false;
  // The epoch this launch must find: the host's count of exchanges on this workspace, which the
  // host needs for the copy engines' target half (0 = not checked). A mismatch is an error (phase
  // kEpochCheck), never a silent write into the wrong half.
  unsigned long long expected_epoch = 0;
  char* const* peers = nullptr;  // device table: every rank's workspace base
  int64_t area[2] = {0, 0};      // byte offset of the data area used in an even / odd epoch
  volatile unsigned int* error = nullptr;
  unsigned long long timeout_ns = 0;
  // combine mode: y[t] = sum over d ascending with home_row[t, d] >= 0 of rows[d][home_row[t, d]]
  const int* home_row = nullptr;  // [T, EP]
  float* y = nullptr;             // [T, H]
  int64_t tokens = 0, hidden = 0;
};

__device__ __forceinline__ char* slot(const Exchange& p, const Field& f, int owner, int half,
                                      int source) {
  return p.peers[owner] + p.area[half] + f.offset + static_cast<int64_t>(source) * f.stride;
}

// dst[0:bytes) = src[0:bytes), spread over all threads of the grid; 16-byte vectors when both
// ends and the size allow it, else 4-byte words (bytes is a multiple of 4, checked by the host).
__device__ inline void copy_bytes(char* dst, const char* src, int64_t bytes, int64_t worker,
                                  int64_t workers) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
        static_cast<uintptr_t>(bytes)) &
       15u) == 0) {
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    const int64_t n = bytes / 16;
    for (int64_t i = worker; i < n; i += workers) d[i] = s[i];
  } else {
    unsigned int* d = reinterpret_cast<unsigned int*>(dst);
    const unsigned int* s = reinterpret_cast<const unsigned int*>(src);
    for (int64_t i = worker; i < bytes / 4; i += workers) d[i] = s[i];
  }
}

// y[t] = sum over d = 0..EP-1 ascending, where home_row[t, d] >= 0, of row home_row[t, d] of
// chunk d (base_of(d): [R, H] rows in T), in float32; one 16-byte vector of a row per step.
template <class T, class BaseOf>
__device__ inline void reduce_home_rows(BaseOf base_of, const int* home_row, float* y,
                                        int64_t tokens, int64_t hidden, int ep, int64_t worker,
                                        int64_t workers) {
  constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte vector
  const int64_t vecs_per_row = hidden / kVec;
  for (int64_t i = worker; i < tokens * vecs_per_row; i += workers) {
    const int64_t t = i / vecs_per_row, v = i % vecs_per_row;
    float acc[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
    for (int d = 0; d < ep; ++d) {
      const int row = home_row[t * ep + d];
      if (row < 0) continue;
      const uint4 raw = reinterpret_cast<const uint4*>(
          base_of(d) + (static_cast<int64_t>(row) * hidden + v * kVec) * sizeof(T))[0];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] += to_float<T>(e[j]);
    }
    float4* out = reinterpret_cast<float4*>(y + t * hidden + v * kVec);
#pragma unroll
    for (int j = 0; j < kVec / 4; ++j)
      out[j] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
  }
}

// Combine: rows computed by rank d for me are in my slot (half, d), or my own chunk in the operand.
template <class T>
__device__ inline void reduce_rows(const Exchange& p, int half, int64_t worker, int64_t workers) {
  const Field& f = p.field[0];
  auto base_of = [&](int d) -> const char* {
    return d == p.rank ? f.src + static_cast<int64_t>(p.rank) * f.chunk_bytes
                       : slot(p, f, p.rank, half, d);
  };
  reduce_home_rows<T>(base_of, p.home_row, p.y, p.tokens, p.hidden, p.ep, worker, workers);
}

// The same reduction over one [EP, R, H] buffer on this device (the XLA transport's combine and
// the packing gather's transpose: mok_home_sum).
template <class T>
__global__ void __launch_bounds__(kThreads)
    home_sum_kernel(const char* rows, int64_t chunk_bytes, const int* home_row, float* y,
                    int64_t tokens, int64_t hidden, int ep) {
  auto base_of = [&](int d) -> const char* { return rows + d * chunk_bytes; };
  reduce_home_rows<T>(base_of, home_row, y, tokens, hidden, ep,
                      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                      static_cast<int64_t>(gridDim.x) * blockDim.x);
}

// 3. wait, bounded (thread 0 of a CTA): a peer that never launches becomes an error naming it.
__device__ inline void wait_peers(const Exchange& p, symmetric::Signal* me,
                                  unsigned long long epoch, int* ok) {
  const unsigned long long deadline = global_timer_ns() + p.timeout_ns;
  for (int q = 0; q < p.ep; ++q) {
    if (q == p.rank) continue;
    if (!wait_flag(&me->arrival[q], epoch, deadline, p.error)) {
      report_error(p.error, ErrorCode(p.phase, q));
      *ok = 0;
      break;
    }
  }
}

// kMode: an ExchangeMode. In-place mode copies my own chunk into my own slot under the peers'
// arrival (a local copy); copy-out mode copies it to the output before the push signal.
template <class T, int kMode>
__global__ void __launch_bounds__(kThreads) exchange_kernel(const Exchange p) {
  constexpr bool kReduces = kMode == kReduce, kLate = kMode == kInPlace;
  using symmetric::Signal;
  Signal* const me = reinterpret_cast<Signal*>(p.peers[p.rank]);
  __shared__ unsigned long long epoch_shared;
  __shared__ int ok_shared;
  if (threadIdx.x == 0) {
    // The previous call on this workspace finished before this one started (stream order).
    epoch_shared = *reinterpret_cast<volatile unsigned long long*>(&me->epoch) + 1;
    ok_shared = 1;
    if (p.expected_epoch != 0 && epoch_shared != p.expected_epoch) {
      report_error(p.error, ErrorCode(kEpochCheck, p.rank));
      ok_shared = 0;
    }
  }
  __syncthreads();
  if (!ok_shared) return;  // the peers time out and report; the workspace is poisoned
  const unsigned long long epoch = epoch_shared;
  const int half = static_cast<int>(epoch & 1ull);
  const int64_t worker = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t workers = static_cast<int64_t>(gridDim.x) * blockDim.x;

  // 1. push (my own chunk goes straight to my output in copy-out mode; combine reads it in place)
  for (int fi = 0; fi < (p.pushed ? 0 : p.num_fields); ++fi) {
    const Field& f = p.field[fi];
    for (int d = 0; d < p.ep; ++d) {
      const char* src = f.src + static_cast<int64_t>(d) * f.chunk_bytes;
      if (d == p.rank) {
        if (!kReduces && !kLate)
          copy_bytes(f.dst + static_cast<int64_t>(d) * f.chunk_bytes, src, f.chunk_bytes, worker,
                     workers);
        continue;
      }
      copy_bytes(slot(p, f, d, half, p.rank), src, f.chunk_bytes, worker, workers);
    }
  }
  __threadfence_system();
  __syncthreads();

  if (threadIdx.x == 0) {
    // 2. signal: the last CTA's release store covers every CTA's stores (fence + ticket).
    const unsigned int ticket = atomicAdd(&me->ticket_pushed, 1u);
    if (ticket == gridDim.x - 1) {
      __threadfence_system();
      me->ticket_pushed = 0u;
      for (int q = 0; q < p.ep; ++q)
        if (q != p.rank)
          store_release_sys(&reinterpret_cast<Signal*>(p.peers[q])->arrival[p.rank], epoch);
    }
    if constexpr (!kLate) wait_peers(p, me, epoch, &ok_shared);  // 3.
  }
  if constexpr (kLate) {
    // My own chunk goes to the output (or my own slot) only now, under the peers' arrival.
    if (!kReduces && !p.pushed)
      for (int fi = 0; fi < p.num_fields; ++fi) {
        const Field& f = p.field[fi];
        const int64_t at = static_cast<int64_t>(p.rank) * f.chunk_bytes;
        char* dst = kMode == kInPlace ? slot(p, f, p.rank, half, p.rank) : f.dst + at;
        copy_bytes(dst, f.src + at, f.chunk_bytes, worker, workers);
      }
    if (threadIdx.x == 0) wait_peers(p, me, epoch, &ok_shared);  // 3.
  }
  __syncthreads();
  if (!ok_shared) return;  // the workspace is poisoned by the host; epochs stay as they are

  // 4. read
  if constexpr (kMode == kReduce) {
    reduce_rows<T>(p, half, worker, workers);
  } else if constexpr (kMode == kCopyOut) {
    for (int fi = 0; fi < p.num_fields; ++fi) {
      const Field& f = p.field[fi];
      for (int s = 0; s < p.ep; ++s)
        if (s != p.rank)
          copy_bytes(f.dst + static_cast<int64_t>(s) * f.chunk_bytes, slot(p, f, p.rank, half, s),
                     f.chunk_bytes, worker, workers);
    }
  }

  // 5. finish: every CTA has read `epoch` from the signal area by now.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned int ticket = atomicAdd(&me->ticket_done, 1u);
    if (ticket == gridDim.x - 1) {
      me->ticket_done = 0u;
      *reinterpret_cast<volatile unsigned long long*>(&me->epoch) = epoch;
      __threadfence();
    }
  }
}

}  // namespace mok::cuda::ep
