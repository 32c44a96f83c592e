// The phase sequences of one call (forward.cu, backward.cu), for the handlers, on XLA's stream and
// without a host sync:
//   forward : route → gate/up GEMM (+SwiGLU) → down GEMM (× routing weight) → combine over k
//   backward: route → gate/up GEMM (h) → dy·Wd^T GEMM (+SwiGLU bwd, d_w partials) → dh·Wgu^T GEMM
//             → combine dx, reduce d_w → weight-gradient GEMMs (K = the expert's tokens)
// Which kernels run is the call's Plan (host/plan.h). Scratch comes from XLA's FFI
// ScratchAllocator.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/problem.h"
#include "cuda/host/device.h"
#include "cuda/host/plan.h"
#include "cuda/host/stage.h"

namespace mok::cuda {

using bf16 = __nv_bfloat16;

// Device scratch for a call, 256-byte aligned (XLA's FFI scratch allocator accepts alignments up
// to 16 bytes: over-allocate and align).
inline ffi::Error AllocateScratch(ffi::ScratchAllocator& scratch, size_t bytes, char** base) {
  auto mem = scratch.Allocate(bytes + 256, 16);
  MOK_CHECK(mem.has_value(), "could not allocate ", bytes, " bytes of device scratch");
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

// The size limits every CUDA phase sequence shares (beyond ReadProblem's checks).
inline ffi::Error CheckCommon(const Problem& pr) {
  MOK_CHECK(pr.hidden % 8 == 0 && pr.ffn % 8 == 0,
            "the CUDA kernels need H and F to be multiples of 8 (16-byte rows), got H=", pr.hidden,
            " F=", pr.ffn);
  MOK_CHECK(pr.assignments() < (int64_t{1} << 30), "T*k must be < 2^30, got ", pr.assignments());
  // The GEMM kernels keep two (E+1)-entry prefix arrays in shared memory beside the tile ring.
  MOK_CHECK(pr.experts <= 4096,
            "the CUDA kernels support E <= 4096 experts per call, got E=", pr.experts);
  return ffi::Error::Success();
}

// The problem of a call that runs Forward / Backward: ReadProblem's checks, then CheckCommon's.
inline ffi::Error ReadCudaProblem(const ffi::AnyBuffer& x, const ffi::AnyBuffer& topk_ids,
                                  const ffi::AnyBuffer& topk_weights,
                                  const ffi::AnyBuffer& w_gate_up, const ffi::AnyBuffer& w_down,
                                  Problem* pr) {
  MOK_RETURN_IF_ERROR(ReadProblem(x, topk_ids, topk_weights, w_gate_up, w_down, pr));
  return CheckCommon(*pr);
}

// Instantiated for bf16 and float. h_save (forward) / h_saved (backward): the gate/up
// pre-activations [T*k, 2F] in x's dtype, rows in the expert-sorted assignment order that both
// directions rebuild identically from topk_ids; with them the backward skips its recompute GEMM.
//
// mxfp8 through the BF16 GEMMs (bf16 x and the wgmma kernels only; docs/fp8.md): the data-path
// GEMMs read mxfp8 operands exactly dequantized to bf16. Forward (mx_act): the caller passes x
// and the weights as deq(Q(.)) and the gate/up epilogue stores a as deq(Q(a)). Backward
// (dy_mx = deq(Q(dy)), non-null): dy·Wd^T reads dy_mx (dy stays the dWd operand), dh·Wgu^T reads
// deq(Q(dh)) (dh stays the dWgu operand), and h must be saved; the weights are the backward's
// deq(Q(.)) layouts (w_down along H, w_gate_up along 2F), or with qdq_weights the weights
// themselves, whose layouts are then made one at a time in scratch before the GEMM that reads it.
template <class T>
ffi::Error Forward(cudaStream_t stream, ffi::ScratchAllocator& scratch, const Plan& plan,
                   const Problem& pr, const T* x, const int* ids, const float* w, const T* wgu,
                   const T* wd, T* y, T* h_save = nullptr, bool mx_act = false);

template <class T>
ffi::Error Backward(cudaStream_t stream, ffi::ScratchAllocator& scratch, const Plan& plan,
                    const Problem& pr, const T* dy, const T* x, const int* ids, const float* w,
                    const T* wgu, const T* wd, T* dx, float* d_w, T* d_wgu, T* d_wd,
                    const T* h_saved = nullptr, const T* dy_mx = nullptr, bool qdq_weights = false);

}  // namespace mok::cuda
