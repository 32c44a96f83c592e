// Entry points of the FP8 phase sequences (phases/fp8_forward.cu, fp8_backward.cu) for the FP8
// handlers. Operands are E4M3 bytes with their scales (fp8_format.cuh); every quantized operand
// is K-major (the reduction dim contiguous), which FP8 wgmma requires.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/problem.h"
#include "cuda/device/fp8_format.cuh"
#include "cuda/host/device.h"
#include "cuda/host/stage.h"

namespace mok::cuda::fp8 {

// Experts per FP8 call: the GEMMs keep two [E+1] tables in shared memory beside a 4-stage ring
// (fp8_common.cuh checks that both fit the 227 KB opt-in limit at this bound).
constexpr int64_t kFp8MaxExperts = 1024;

// A quantized matrix as the kernels read it: values, and scales of 4 bytes per 128 K per row (or
// per 128-row block of a fp8_block weight).
struct Quantized {
  const uint8_t* values = nullptr;
  const uint8_t* scales = nullptr;
};

// y = the MoE layer's routed experts on quantized x [T, H] and weights in the forward layouts
// w_gate_up [E, 2F, H], w_down [E, H, F]; T is y's dtype (bf16 or float). h_save (training):
// the gate/up pre-activations [T*k, 2F] in T, in the expert-sorted order of the backward.
template <class T>
ffi::Error Forward8(Recipe recipe, cudaStream_t stream, ffi::ScratchAllocator& scratch,
                    const DeviceInfo& dev, const Problem& pr, Quantized x, const int* ids,
                    const float* w, Quantized w_gate_up, Quantized w_down, T* y, T* h_save);

// The backward: dy and x in T (the weight gradients quantize them along tokens), dy and x
// quantized along H, the forward's weights (h is recomputed from them unless h_saved), and the
// backward layouts w_down [E, F, H] (quantized along H) and w_gate_up [E, H, 2F] (along 2F).
struct Backward8Operands {
  const void* dy;
  Quantized dy_q;
  const void* x;
  Quantized x_q;
  const int* ids;
  const float* w;
  Quantized w_gate_up_fwd, w_down_bwd, w_gate_up_bwd;
  const void* h_saved;  // [T*k, 2F] in T, or nullptr
  // MoEConfig.fp8_weight_gradients = "unquantized": the weight gradients by the routed-K GEMMs in
  // T (phases/backward.cu) on x, dy, w·a and dh as they are, instead of FP8 GEMMs on their
  // token-wise quantization.
  bool unquantized_weight_grads = false;
  // With unquantized weight gradients on the wgmma path: x and dy copied once into expert order
  // (attribute pregather_x = 1) or gathered by the weight-gradient GEMMs themselves (0).
  int32_t pregather_x = 0;
};
template <class T>
ffi::Error Backward8(Recipe recipe, cudaStream_t stream, ffi::ScratchAllocator& scratch,
                     const DeviceInfo& dev, const Problem& pr, const Backward8Operands& op, T* dx,
                     float* d_w, T* d_w_gate_up, T* d_w_down);

// Expert weights w [E, A, B] in T quantized in one pass (fp8_quantize.cuh: quantize_weight) into
// the requested layouts (a null `values` skips one): along A -> values [E, B, A], along B ->
// values [E, A, B], with the recipe's weight scales. A and B multiples of 128.
struct WeightLayouts {
  uint8_t *along_a_values = nullptr, *along_a_scales = nullptr;
  uint8_t *along_b_values = nullptr, *along_b_scales = nullptr;
};
template <class T>
ffi::Error QuantizeWeight(Recipe recipe, cudaStream_t stream, const T* w, int64_t experts,
                          int64_t a_dim, int64_t b_dim, const WeightLayouts& out);

// values [rows, cols] and scales (cols / 32 bytes per row) of src [rows, cols] in T.
template <class T>
ffi::Error QuantizeRows(Recipe recipe, cudaStream_t stream, const DeviceInfo& dev, const T* src,
                        int64_t rows, int64_t cols, uint8_t* values, uint8_t* scales);

}  // namespace mok::cuda::fp8
