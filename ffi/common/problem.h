// The MoE problem as the handlers see it: sizes read off the operands, validated once, shared by
// both backends (see docs/ffi-contract.md).
#pragma once

#include <cstdint>

#include "common/check.h"

namespace mok {

struct Problem {
  int64_t tokens = 0;     // T
  int64_t hidden = 0;     // H
  int64_t ffn = 0;        // F
  int64_t experts = 0;    // E
  int64_t top_k = 0;      // k
  ffi::DataType dtype{};  // x / weights

  int64_t assignments() const { return tokens * top_k; }
};

inline const char* DtypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32:
      return "float32";
    case ffi::DataType::BF16:
      return "bfloat16";
    case ffi::DataType::F16:
      return "float16";
    case ffi::DataType::S32:
      return "int32";
    default:
      return "other";
  }
}

// Reads and cross-checks the five forward operands. `dy` (backward only) is checked by the caller.
inline ffi::Error ReadProblem(const ffi::AnyBuffer& x, const ffi::AnyBuffer& topk_ids,
                              const ffi::AnyBuffer& topk_weights, const ffi::AnyBuffer& w_gate_up,
                              const ffi::AnyBuffer& w_down, Problem* p) {
  auto xd = x.dimensions();
  auto id = topk_ids.dimensions();
  auto wd = topk_weights.dimensions();
  auto gu = w_gate_up.dimensions();
  auto dn = w_down.dimensions();
  MOK_CHECK(xd.size() == 2, "x must be rank 2 [T, H], got rank ", xd.size());
  MOK_CHECK(id.size() == 2, "topk_ids must be rank 2 [T, k], got rank ", id.size());
  MOK_CHECK(wd.size() == 2, "topk_weights must be rank 2 [T, k], got rank ", wd.size());
  MOK_CHECK(gu.size() == 3, "w_gate_up must be rank 3 [E, H, 2F], got rank ", gu.size());
  MOK_CHECK(dn.size() == 3, "w_down must be rank 3 [E, F, H], got rank ", dn.size());
  p->tokens = xd[0];
  p->hidden = xd[1];
  p->top_k = id[1];
  p->experts = gu[0];
  p->ffn = dn[1];
  p->dtype = x.element_type();
  MOK_CHECK(p->dtype == ffi::DataType::F32 || p->dtype == ffi::DataType::BF16,
            "x must be float32 or bfloat16, got ", DtypeName(p->dtype));
  MOK_CHECK(topk_ids.element_type() == ffi::DataType::S32, "topk_ids must be int32, got ",
            DtypeName(topk_ids.element_type()));
  MOK_CHECK(topk_weights.element_type() == ffi::DataType::F32, "topk_weights must be float32, got ",
            DtypeName(topk_weights.element_type()));
  MOK_CHECK(w_gate_up.element_type() == p->dtype && w_down.element_type() == p->dtype,
            "w_gate_up and w_down must have x's dtype ", DtypeName(p->dtype), ", got ",
            DtypeName(w_gate_up.element_type()), " and ", DtypeName(w_down.element_type()));
  MOK_CHECK(id[0] == p->tokens && wd[0] == p->tokens && wd[1] == p->top_k, "topk_ids ", id[0], "x",
            id[1], " and topk_weights ", wd[0], "x", wd[1], " must both be [T=", p->tokens, ", k]");
  MOK_CHECK(gu[1] == p->hidden && gu[2] == 2 * p->ffn, "w_gate_up must be [E, H=", p->hidden,
            ", 2F=", 2 * p->ffn, "], got [", gu[0], ", ", gu[1], ", ", gu[2], "]");
  MOK_CHECK(dn[0] == p->experts && dn[2] == p->hidden, "w_down must be [E=", p->experts,
            ", F, H=", p->hidden, "], got [", dn[0], ", ", dn[1], ", ", dn[2], "]");
  MOK_CHECK(p->experts >= 1 && p->top_k >= 1, "need E >= 1 and k >= 1, got E=", p->experts,
            " k=", p->top_k);
  return ffi::Error::Success();
}

}  // namespace mok
