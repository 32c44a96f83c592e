// The expert GEMMs of the overlapped fused forward (JAX_MOK_PEER_OVERLAP=1, ep_handlers.cu)
// start before the peers' x rows have landed: a tile that holds rows of another rank waits,
// bounded, for that rank's arrival flag (Signal::arrival_x, written by the peer's copy-engine
// stream once its rows are stored). Bitwise tested on 2 x H200 (2026-11-30); not faster yet.
#pragma once

#include <cstdint>

#include "cuda/device/exchange_sync.cuh"

namespace mok::cuda {

// Which rows a GEMM must wait for, and how. flags == nullptr: nothing to wait for (default).
struct RowWait {
  const unsigned long long* flags = nullptr;  // [EP] my Signal::arrival_x
  unsigned long long target = 0;              // this call's number (host-counted, 1, 2, ...)
  int rows_per_source = 0;                    // R: row i came from rank i / R
  int self = 0, sources = 0;                  // my rank, EP
  volatile unsigned int* error = nullptr;     // the workspace's error word
  unsigned long long timeout_ns = 0;
};

#ifdef __CUDACC__
// One thread: waits for every other rank's rows. False (and the error word set, naming the
// rank, phase "dispatch") when a rank does not arrive in time or another wait already failed.
__device__ inline bool wait_rows_arrived(const RowWait& w) {
  const unsigned long long deadline = ep::global_timer_ns() + w.timeout_ns;
  for (int s = 0; s < w.sources; ++s) {
    if (s == w.self) continue;
    if (!ep::wait_flag(&w.flags[s], w.target, deadline, w.error)) {
      ep::report_error(w.error, ep::ErrorCode(ep::kDispatch, s));
      return false;
    }
  }
  return true;
}

// Before a phase that reads every row at once (the x pregather, the SIMT GEMM).
static __global__ void wait_rows_kernel(const RowWait w) {
  if (threadIdx.x == 0) wait_rows_arrived(w);
}
#endif  // __CUDACC__

}  // namespace mok::cuda
