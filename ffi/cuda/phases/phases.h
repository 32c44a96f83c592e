// Entry points of the forward and backward phase sequences (forward.cu, backward.cu), for the
// handlers; the phases themselves are in moe.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/problem.h"
#include "cuda/host/stage.h"

namespace mok::cuda {

using bf16 = __nv_bfloat16;

// XLA's FFI scratch allocator accepts alignments up to 16 bytes: over-allocate and align to 256.
inline ffi::Error AllocateScratch(ffi::ScratchAllocator& scratch, size_t bytes, char** base) {
  auto mem = scratch.Allocate(bytes + 256, 16);
  MOK_CUDA_CHECK(mem.has_value(), "could not allocate ", bytes, " bytes of device scratch");
  const uintptr_t p = reinterpret_cast<uintptr_t>(*mem);
  *base = reinterpret_cast<char*>((p + 255) & ~uintptr_t{255});
  return ffi::Error::Success();
}

// Calls fn(T{}) with T the storage type of `dtype` (bf16 or float; ReadProblem admits no other).
template <typename Fn>
ffi::Error DispatchDtype(ffi::DataType dtype, Fn&& fn) {
  if (dtype == ffi::DataType::BF16) return fn(bf16{});
  return fn(float{});
}

// handlers.cu: the device's properties (cached; sets the current device; sm_90 only) and the
// size limits every CUDA phase sequence shares.
ffi::Error GetDevice(int32_t ordinal, DeviceInfo* info);
ffi::Error CheckCommon(const Problem& pr);

// Defined in forward.cu / backward.cu (separate translation units: they build in parallel),
// instantiated for bf16 and float. h_save (forward) / h_saved (backward): the gate/up
// pre-activations [T*k, 2F] in x's dtype, rows in the expert-sorted assignment order that both
// directions rebuild identically from topk_ids; with them the backward skips its recompute GEMM.
struct RowWait;  // row_wait.cuh

// `wait` (the overlapped fused forward, ep_handlers.cu): rows of other ranks may still be landing;
// the phases that read x wait for them (per GEMM tile, or before a phase that reads all rows).
template <class T>
ffi::Error Forward(cudaStream_t stream, ffi::ScratchAllocator& scratch, const DeviceInfo& dev,
                   const Problem& pr, const T* x, const int* ids, const float* w, const T* wgu,
                   const T* wd, T* y, T* h_save = nullptr, const RowWait* wait = nullptr);

template <class T>
ffi::Error Backward(cudaStream_t stream, ffi::ScratchAllocator& scratch, const DeviceInfo& dev,
                    const Problem& pr, const T* dy, const T* x, const int* ids, const float* w,
                    const T* wgu, const T* wd, T* dx, float* d_w, T* d_wgu, T* d_wd,
                    const T* h_saved = nullptr);

}  // namespace mok::cuda
