// The device primitives every kernel shares: element conversion, paired loads and stores, the
// wgmma accumulator-fragment coordinate map, cp.async, mbarrier, TMA and proxy-fence wrappers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace mok::cuda {

using bf16 = __nv_bfloat16;

// ------------------------------------------------------------------ element conversion
template <class T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<bf16>(bf16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float v) {
  return __float2bfloat16_rn(v);
}

// Stores two consecutive output elements (one 4-byte store for bf16, 8-byte for f32).
template <class T>
__device__ __forceinline__ void store2(T* dst, float v0, float v1);
template <>
__device__ __forceinline__ void store2<float>(float* dst, float v0, float v1) {
  *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
}
template <>
__device__ __forceinline__ void store2<bf16>(bf16* dst, float v0, float v1) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
}

// Two adjacent elements as floats (the pair store2 wrote).
template <class T>
__device__ __forceinline__ float2 load2(const T* src);
template <>
__device__ __forceinline__ float2 load2<float>(const float* src) {
  return *reinterpret_cast<const float2*>(src);
}
template <>
__device__ __forceinline__ float2 load2<bf16>(const bf16* src) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(src));
}

// Four adjacent elements as floats (16 bytes of float, 8 of bf16).
template <class T>
__device__ __forceinline__ float4 load4(const T* src);
template <>
__device__ __forceinline__ float4 load4<float>(const float* src) {
  return *reinterpret_cast<const float4*>(src);
}
template <>
__device__ __forceinline__ float4 load4<bf16>(const bf16* src) {
  const uint2 raw = *reinterpret_cast<const uint2*>(src);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// 1 / (1 + e^-v) with the approximate reciprocal (MUFU.RCP): within 2 ulp of the correctly
// rounded one, whose IEEE division (Newton steps, a slow-path branch) cost more than the rest of
// the SwiGLU epilogues. 0 where e^-v overflows, NaN stays NaN.
// e^-v is __expf's: MUFU.EX2 of -v log2(e), but flushing a subnormal result to zero (ftz), which
// saves __expf's three-instruction fix-up per call (an argument below -126 halved, the result
// squared). The sigmoid is the same bits either way: e^-v < 2^-126 vanishes in 1 + e^-v.
__device__ __forceinline__ float sigmoidf(float v) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(-v * 1.4426950408889634f));
  return __fdividef(1.f, 1.f + e);
}

// ------------------------------------------------------------------ accumulator fragments
// The wgmma m64nNk16 f32 accumulator layout, which the SIMT path reproduces so that both share
// one epilogue: a warpgroup owns 64 rows; value i of a thread sits at
//   row = 16 * warp + lane / 4 + 8 * ((i >> 1) & 1),   col = 8 * (i >> 2) + 2 * (lane % 4) + (i &
//   1).
__host__ __device__ __forceinline__ int frag_row(int i, int thread_in_wg) {
  return 16 * (thread_in_wg >> 5) + ((thread_in_wg & 31) >> 2) + 8 * ((i >> 1) & 1);
}
__host__ __device__ __forceinline__ int frag_col(int i, int thread_in_wg) {
  return 8 * (i >> 2) + 2 * (thread_in_wg & 3) + (i & 1);
}

// ------------------------------------------------------------------ async copies and barriers
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global → shared copy; zero-fills the destination when `valid` is false.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// Closes this thread's cp.async copies issued since the last commit into one group.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// Arrives on `bar` once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar))
               : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// Arrives on `bar` and adds `bytes` to the transaction count it waits for (TMA completions).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// One TMA box of a 3-D tensor map into shared memory, completing on `bar` by byte count.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* tensor_map, uint64_t* bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(tensor_map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tensor_map, uint64_t* bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(tensor_map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// One box of shared memory (128B-swizzled like the tensor map) to a 3-D tensor, as a bulk group of
// this thread; bulk_commit closes the group. Only the issuing thread can wait for it.
__device__ __forceinline__ void tma_store_3d(const void* tensor_map, uint32_t src, int c0, int c1,
                                             int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          tensor_map),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Until at most N of this thread's bulk groups are incomplete, or (kReadOnly) still read shared
// memory (their buffers may then be written again).
template <int N, bool kReadOnly>
__device__ __forceinline__ void bulk_wait() {
  if constexpr (kReadOnly)
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
  else
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace mok::cuda
