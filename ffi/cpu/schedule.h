// The routing plan: per-expert counts, offsets and the assignments sorted by expert (stable in
// token order), computed from topk_ids inside the kernel. Mirrors ffi/cuda's schedule phase.
#pragma once

#include <cstdint>
#include <vector>

namespace mok::cpu {

struct RoutingPlan {
  int64_t experts = 0;
  int64_t top_k = 0;
  std::vector<int64_t> offsets;   // [E+1]: expert e owns sorted slots offsets[e]..offsets[e+1]
  std::vector<int64_t> order;     // [valid]: flat assignment index t*k + j, sorted by expert
  std::vector<int64_t> token_of;  // [valid]: token t of each sorted slot (gather index)
  std::vector<int64_t> slot_of;   // [T*k]: sorted slot of each assignment, -1 when skipped

  int64_t valid() const { return static_cast<int64_t>(order.size()); }
};

// ids outside [0, E) are skipped (capacity drops use -1).
inline RoutingPlan BuildPlan(const int32_t* ids, int64_t tokens, int64_t top_k, int64_t experts) {
  RoutingPlan plan;
  plan.experts = experts;
  plan.top_k = top_k;
  const int64_t n = tokens * top_k;
  std::vector<int64_t> counts(static_cast<size_t>(experts), 0);
  for (int64_t a = 0; a < n; ++a) {
    if (ids[a] >= 0 && ids[a] < experts) ++counts[ids[a]];
  }
  plan.offsets.assign(static_cast<size_t>(experts + 1), 0);
  for (int64_t e = 0; e < experts; ++e) plan.offsets[e + 1] = plan.offsets[e] + counts[e];
  std::vector<int64_t> cursor(plan.offsets.begin(), plan.offsets.end() - 1);
  plan.order.resize(static_cast<size_t>(plan.offsets[experts]));
  plan.token_of.resize(plan.order.size());
  plan.slot_of.assign(static_cast<size_t>(n), -1);
  for (int64_t a = 0; a < n; ++a) {
    const int32_t e = ids[a];
    if (e < 0 || e >= experts) continue;
    const int64_t s = cursor[e]++;
    plan.order[s] = a;
    plan.token_of[s] = a / top_k;
    plan.slot_of[a] = s;
  }
  return plan;
}

// Work items: (expert, first sorted slot, rows), at most `block` rows each.
struct RowBlock {
  int64_t expert;
  int64_t begin;
  int64_t rows;
};

inline std::vector<RowBlock> SplitRows(const RoutingPlan& plan, int64_t block) {
  std::vector<RowBlock> items;
  for (int64_t e = 0; e < plan.experts; ++e) {
    for (int64_t s = plan.offsets[e]; s < plan.offsets[e + 1]; s += block) {
      items.push_back({e, s, std::min(block, plan.offsets[e + 1] - s)});
    }
  }
  return items;
}

}  // namespace mok::cpu
