// Device-side synchronization of the peer transport: system-scope release/acquire flags and
// bounded waits (docs/peer-transport.md, "Memory ordering and epochs", "Bounded waits").
//
// Status (2026-11-29): run on 2 x H200 inside the exchange kernel. The same
// pattern (st.release.sys flag with an epoch, bounded spin on the peer's flag) was seen working
// in a throwaway handshake on 2 x H200 (../shared/DEVICE.md).
#pragma once

#include <cstdint>

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

}  // namespace mok::cuda::ep
