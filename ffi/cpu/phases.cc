#include "cpu/phases.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/parallel.h"
#include "cpu/schedule.h"

namespace mok::cpu {
namespace {

// Rows of one expert processed together: large enough to amortise packing the weight panels,
// small enough that the per-block activations stay in L2.
constexpr int64_t kRowBlock = 64;

size_t ElemSize(Dtype d) { return d == Dtype::kF32 ? 4 : 2; }

const void* Offset(const void* base, Dtype d, int64_t elems) {
  return static_cast<const char*>(base) + elems * static_cast<int64_t>(ElemSize(d));
}

void StoreRow(const float* src, int64_t n, Dtype d, void* dst) {
  if (d == Dtype::kF32) {
    std::copy(src, src + n, static_cast<float*>(dst));
  } else {
    auto* out = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) out[i] = F32ToBf16(src[i]);
  }
}

inline float Sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// h [rows, 2F] -> a [rows, F] = silu(h[:, :F]) * h[:, F:]
void SwiGlu(const float* h, int64_t rows, int64_t ffn, float* a) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = h + r * 2 * ffn;
    const float* up = gate + ffn;
    float* out = a + r * ffn;
    for (int64_t f = 0; f < ffn; ++f) out[f] = gate[f] * Sigmoid(gate[f]) * up[f];
  }
}

// Overwrites h [rows, 2F] with dL/dh given d_a [rows, F].
void SwiGluBackward(float* h, const float* d_a, int64_t rows, int64_t ffn) {
  for (int64_t r = 0; r < rows; ++r) {
    float* gate = h + r * 2 * ffn;
    float* up = gate + ffn;
    const float* da = d_a + r * ffn;
    for (int64_t f = 0; f < ffn; ++f) {
      const float g = gate[f], u = up[f], s = Sigmoid(g);
      const float silu = g * s;
      gate[f] = da[f] * u * s * (1.0f + g * (1.0f - s));
      up[f] = da[f] * silu;
    }
  }
}

// out[t] = sum_j rows[slot_of[t, j]] over valid j, in j order (deterministic), cast to dtype.
void CombineRows(const RoutingPlan& plan, const float* rows, int64_t tokens, int64_t width,
                 Dtype dtype, void* out, int workers) {
  const int64_t chunk = 64;
  ParallelFor((tokens + chunk - 1) / chunk, workers, [&](int64_t c, int) {
    std::vector<float> acc(static_cast<size_t>(width));
    for (int64_t t = c * chunk; t < std::min(tokens, (c + 1) * chunk); ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < plan.top_k; ++j) {
        const int64_t s = plan.slot_of[t * plan.top_k + j];
        if (s < 0) continue;
        const float* src = rows + s * width;
        for (int64_t i = 0; i < width; ++i) acc[i] += src[i];
      }
      StoreRow(acc.data(), width, dtype,
               static_cast<char*>(out) + t * width * static_cast<int64_t>(ElemSize(dtype)));
    }
  });
}

}  // namespace

void MoeForward(const MoeOperands& op, void* y) {
  const int64_t H = op.hidden, F = op.ffn;
  const RoutingPlan plan = BuildPlan(op.topk_ids, op.tokens, op.top_k, op.experts);
  const std::vector<RowBlock> items = SplitRows(plan, kRowBlock);
  const int workers = NumThreads();
  // Weighted expert output of every valid assignment, in sorted order: [valid, H] f32.
  std::vector<float> outs(static_cast<size_t>(plan.valid() * H));

  struct Scratch {
    std::vector<float> h, a;
    GemmScratch gemm;
  };
  std::vector<Scratch> scratch(static_cast<size_t>(workers));
  ParallelFor(static_cast<int64_t>(items.size()), workers, [&](int64_t i, int w) {
    const RowBlock& it = items[i];
    Scratch& s = scratch[w];
    s.h.assign(static_cast<size_t>(it.rows * 2 * F), 0.0f);
    s.a.resize(static_cast<size_t>(it.rows * F));
    const MatView x_rows{op.x, op.dtype, H, 1, plan.token_of.data() + it.begin, nullptr};
    const MatView w_gate_up =
        RowMajor(Offset(op.w_gate_up, op.dtype, it.expert * H * 2 * F), op.dtype, 2 * F);
    Gemm(it.rows, 2 * F, H, x_rows, w_gate_up, s.h.data(), 2 * F, &s.gemm);  // (rows, 2F)
    SwiGlu(s.h.data(), it.rows, F, s.a.data());                              // (rows, F)
    float* out = outs.data() + it.begin * H;                                 // (rows, H)
    std::fill(out, out + it.rows * H, 0.0f);
    const MatView w_down = RowMajor(Offset(op.w_down, op.dtype, it.expert * F * H), op.dtype, H);
    Gemm(it.rows, H, F, RowMajor(s.a.data(), Dtype::kF32, F), w_down, out, H, &s.gemm);
    for (int64_t r = 0; r < it.rows; ++r) {
      const float weight = op.topk_weights[plan.order[it.begin + r]];
      for (int64_t c = 0; c < H; ++c) out[r * H + c] *= weight;
    }
  });
  CombineRows(plan, outs.data(), op.tokens, H, op.dtype, y, workers);
}

void MoeBackward(const MoeOperands& op, const void* dy, void* dx, float* d_topk_weights,
                 void* d_w_gate_up, void* d_w_down) {
  const int64_t H = op.hidden, F = op.ffn, E = op.experts;
  const RoutingPlan plan = BuildPlan(op.topk_ids, op.tokens, op.top_k, E);
  const int workers = NumThreads();
  std::fill(d_topk_weights, d_topk_weights + op.tokens * op.top_k, 0.0f);
  // dx contribution of every valid assignment, sorted order: [valid, H] f32.
  std::vector<float> dx_rows(static_cast<size_t>(plan.valid() * H));

  // One thread owns a whole expert, so its weight gradients are summed over row blocks in a
  // fixed order. Largest experts first for balance; the order does not change any result.
  std::vector<int64_t> experts(static_cast<size_t>(E));
  std::iota(experts.begin(), experts.end(), 0);
  std::stable_sort(experts.begin(), experts.end(), [&](int64_t a, int64_t b) {
    return plan.offsets[a + 1] - plan.offsets[a] > plan.offsets[b + 1] - plan.offsets[b];
  });

  struct Scratch {
    std::vector<float> h, a, g, a_weighted, d_gate_up, d_down;
    GemmScratch gemm;
  };
  std::vector<Scratch> scratch(static_cast<size_t>(workers));
  ParallelFor(E, workers, [&](int64_t i, int w) {
    const int64_t e = experts[i];
    Scratch& s = scratch[w];
    s.d_gate_up.assign(static_cast<size_t>(H * 2 * F), 0.0f);  // (H, 2F)
    s.d_down.assign(static_cast<size_t>(F * H), 0.0f);         // (F, H)
    const void* wgu_e = Offset(op.w_gate_up, op.dtype, e * H * 2 * F);
    const void* wd_e = Offset(op.w_down, op.dtype, e * F * H);
    for (int64_t begin = plan.offsets[e]; begin < plan.offsets[e + 1]; begin += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, plan.offsets[e + 1] - begin);
      const int64_t* tokens = plan.token_of.data() + begin;
      const MatView x_rows{op.x, op.dtype, H, 1, tokens, nullptr};  // (rows, H)
      const MatView dy_rows{dy, op.dtype, H, 1, tokens, nullptr};   // (rows, H)
      s.h.assign(static_cast<size_t>(rows * 2 * F), 0.0f);
      s.a.resize(static_cast<size_t>(rows * F));
      s.g.assign(static_cast<size_t>(rows * F), 0.0f);
      s.a_weighted.resize(static_cast<size_t>(rows * F));
      Gemm(rows, 2 * F, H, x_rows, RowMajor(wgu_e, op.dtype, 2 * F), s.h.data(), 2 * F,
           &s.gemm);                                               // h (rows, 2F)
      SwiGlu(s.h.data(), rows, F, s.a.data());                     // a (rows, F)
      const MatView wd_t{wd_e, op.dtype, 1, H, nullptr, nullptr};  // Wd^T (H, F)
      Gemm(rows, F, H, dy_rows, wd_t, s.g.data(), F, &s.gemm);     // g = dy Wd^T (rows, F)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t assignment = plan.order[begin + r];
        const float weight = op.topk_weights[assignment];
        float dot = 0.0f;
        for (int64_t f = 0; f < F; ++f) {
          dot += s.g[r * F + f] * s.a[r * F + f];
          s.g[r * F + f] *= weight;  // d_a
          s.a_weighted[r * F + f] = s.a[r * F + f] * weight;
        }
        d_topk_weights[assignment] = dot;
      }
      // dWd += (w a)^T dy : (F, rows) @ (rows, H)
      const MatView aw_t{s.a_weighted.data(), Dtype::kF32, 1, F, nullptr, nullptr};
      Gemm(F, H, rows, aw_t, dy_rows, s.d_down.data(), H, &s.gemm);
      SwiGluBackward(s.h.data(), s.g.data(), rows, F);  // h := d_h (rows, 2F)
      // dWgu += x^T d_h : (H, rows) @ (rows, 2F)
      const MatView x_t{op.x, op.dtype, 1, H, nullptr, tokens};
      Gemm(H, 2 * F, rows, x_t, RowMajor(s.h.data(), Dtype::kF32, 2 * F), s.d_gate_up.data(), 2 * F,
           &s.gemm);
      // dx rows = d_h Wgu^T : (rows, 2F) @ (2F, H)
      float* dx_out = dx_rows.data() + begin * H;
      std::fill(dx_out, dx_out + rows * H, 0.0f);
      const MatView wgu_t{wgu_e, op.dtype, 1, 2 * F, nullptr, nullptr};
      Gemm(rows, H, 2 * F, RowMajor(s.h.data(), Dtype::kF32, 2 * F), wgu_t, dx_out, H, &s.gemm);
    }
    const size_t esz = ElemSize(op.dtype);
    StoreRow(s.d_gate_up.data(), H * 2 * F, op.dtype,
             static_cast<char*>(d_w_gate_up) + e * H * 2 * F * static_cast<int64_t>(esz));
    StoreRow(s.d_down.data(), F * H, op.dtype,
             static_cast<char*>(d_w_down) + e * F * H * static_cast<int64_t>(esz));
  });
  CombineRows(plan, dx_rows.data(), op.tokens, H, op.dtype, dx, workers);
}

}  // namespace mok::cpu
