// A small cache-blocked float32 GEMM, C[M,N] += A[M,K] @ B[K,N], over MatViews.
// Blocking follows the usual packed scheme: B is packed per (KC x NC) block into NR-wide
// column panels, A per (MC x KC) block into MR-tall row panels, and a register-blocked
// micro-kernel multiplies one A panel by one B panel. Single-threaded: callers parallelise over
// independent work items, which keeps every reduction order fixed (bitwise determinism).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/numeric.h"

namespace mok::cpu {

constexpr int kMR = 6;
constexpr int kNR = 16;
constexpr int64_t kMC = 96;
constexpr int64_t kKC = 256;
constexpr int64_t kNC = 1024;

// Reusable packing buffers, one per thread.
struct GemmScratch {
  std::vector<float> a_pack;  // (MC/MR panels, KC, MR)
  std::vector<float> b_pack;  // (NC/NR panels, KC, NR)
};

// acc = Ap (kc x MR, k-major) @ Bp (kc x NR, k-major); C[0:mr, 0:nr] += acc.
void MicroKernel(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, int mr,
                 int nr);

void Gemm(int64_t m, int64_t n, int64_t k, const MatView& a, const MatView& b, float* c,
          int64_t ldc, GemmScratch* scratch);

}  // namespace mok::cpu
