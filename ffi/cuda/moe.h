// Entry points of the forward and backward phase sequences (forward.cu, backward.cu), for the
// handlers; the phases themselves are in moe.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/problem.h"
#include "cuda/status.cuh"

namespace mok::cuda {

using bf16 = __nv_bfloat16;

// Defined in forward.cu / backward.cu (separate translation units: they build in parallel),
// instantiated for bf16 and float. h_save (forward) / h_saved (backward): the gate/up
// pre-activations [T*k, 2F] in x's dtype, rows in the expert-sorted assignment order that both
// directions rebuild identically from topk_ids; with them the backward skips its recompute GEMM.
template <class T>
ffi::Error Forward(cudaStream_t stream, ffi::ScratchAllocator& scratch, const DeviceInfo& dev,
                   const Problem& pr, const T* x, const int* ids, const float* w, const T* wgu,
                   const T* wd, T* y, T* h_save = nullptr);

template <class T>
ffi::Error Backward(cudaStream_t stream, ffi::ScratchAllocator& scratch, const DeviceInfo& dev,
                    const Problem& pr, const T* dy, const T* x, const int* ids, const float* w,
                    const T* wgu, const T* wd, T* dx, float* d_w, T* d_wgu, T* d_wd,
                    const T* h_saved = nullptr);

}  // namespace mok::cuda
