// CPU phases of the MoE layer, named like their CUDA counterparts:
//   schedule (counts/offsets/sort) -> gate/up GEMM on gathered rows + SwiGLU -> down GEMM x
//   routing weight -> combine over k in a fixed order.
#pragma once

#include <cstdint>

#include "cpu/numeric.h"

namespace mok::cpu {

struct MoeOperands {
  const void* x = nullptr;              // [T, H]
  const int32_t* topk_ids = nullptr;    // [T, k]
  const float* topk_weights = nullptr;  // [T, k]
  const void* w_gate_up = nullptr;      // [E, H, 2F]
  const void* w_down = nullptr;         // [E, F, H]
  Dtype dtype = Dtype::kF32;
  int64_t tokens = 0, hidden = 0, ffn = 0, experts = 0, top_k = 0;
};

// y [T, H] in the operands' dtype.
void MoeForward(const MoeOperands& op, void* y);

// dx [T, H] (dtype), d_topk_weights [T, k] f32, d_w_gate_up [E, H, 2F], d_w_down [E, F, H].
void MoeBackward(const MoeOperands& op, const void* dy, void* dx, float* d_topk_weights,
                 void* d_w_gate_up, void* d_w_down);

}  // namespace mok::cpu
