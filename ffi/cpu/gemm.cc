#include "cpu/gemm.h"

#include <cstring>

namespace mok::cpu {
namespace {

// Packs A[i0:i0+mc, p0:p0+kc] into MR-row panels: panel q holds rows q*MR.., stored k-major.
void PackA(const MatView& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* out) {
  for (int64_t q = 0; q < mc; q += kMR) {
    const int rows = static_cast<int>(std::min<int64_t>(kMR, mc - q));
    float* panel = out + q * kc;
    for (int64_t p = 0; p < kc; ++p) {
      for (int r = 0; r < kMR; ++r) {
        panel[p * kMR + r] = r < rows ? a.At(i0 + q + r, p0 + p) : 0.0f;
      }
    }
  }
}

// Packs B[p0:p0+kc, j0:j0+nc] into NR-column panels, each stored k-major. The contiguous,
// ungathered case (the weights) takes a fast path with one row segment per k.
void PackB(const MatView& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* out) {
  for (int64_t q = 0; q < nc; q += kNR) {
    const int cols = static_cast<int>(std::min<int64_t>(kNR, nc - q));
    float* panel = out + q * kc;
    const bool contiguous = b.col_stride == 1 && b.cols == nullptr;
    for (int64_t p = 0; p < kc; ++p) {
      float* dst = panel + p * kNR;
      if (contiguous) {
        int64_t row = b.rows ? b.rows[p0 + p] : p0 + p;
        int64_t off = row * b.row_stride + j0 + q;
        if (b.dtype == Dtype::kF32) {
          const float* src = static_cast<const float*>(b.ptr) + off;
          for (int c = 0; c < cols; ++c) dst[c] = src[c];
        } else {
          const uint16_t* src = static_cast<const uint16_t*>(b.ptr) + off;
          for (int c = 0; c < cols; ++c) dst[c] = Bf16ToF32(src[c]);
        }
      } else {
        for (int c = 0; c < cols; ++c) dst[c] = b.At(p0 + p, j0 + q + c);
      }
      for (int c = cols; c < kNR; ++c) dst[c] = 0.0f;
    }
  }
}

}  // namespace

// GCC/Clang vector extension: 8 floats. On the AVX2 clone one vector is one ymm register; the
// default clone splits it into two SSE halves. Scalars broadcast in mixed arithmetic.
typedef float Vec8 __attribute__((vector_size(32)));
static_assert(kNR == 16, "the micro-kernel holds a 16-wide row as two Vec8");

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// One binary for every x86-64 machine: an AVX2+FMA clone is picked at load time where present.
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void MicroKernel(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, int mr,
                 int nr) {
  Vec8 acc[kMR][2] = {};  // (MR, NR) accumulators in registers
  for (int64_t p = 0; p < kc; ++p) {
    Vec8 b0, b1;
    std::memcpy(&b0, bp + p * kNR, sizeof(Vec8));
    std::memcpy(&b1, bp + p * kNR + 8, sizeof(Vec8));
    const float* a = ap + p * kMR;
    for (int r = 0; r < kMR; ++r) {
      acc[r][0] += a[r] * b0;
      acc[r][1] += a[r] * b1;
    }
  }
  float tile[kMR][kNR];
  std::memcpy(tile, acc, sizeof(tile));
  for (int r = 0; r < mr; ++r) {
    for (int j = 0; j < nr; ++j) c[r * ldc + j] += tile[r][j];
  }
}

void Gemm(int64_t m, int64_t n, int64_t k, const MatView& a, const MatView& b, float* c,
          int64_t ldc, GemmScratch* scratch) {
  if (m == 0 || n == 0 || k == 0) return;
  const int64_t nc_max = std::min(kNC, (n + kNR - 1) / kNR * kNR);
  const int64_t mc_max = std::min(kMC, (m + kMR - 1) / kMR * kMR);
  const int64_t kc_max = std::min(kKC, k);
  scratch->b_pack.resize(static_cast<size_t>(nc_max * kc_max));
  scratch->a_pack.resize(static_cast<size_t>(mc_max * kc_max));
  float* bp = scratch->b_pack.data();
  float* ap = scratch->a_pack.data();
  for (int64_t j0 = 0; j0 < n; j0 += kNC) {
    const int64_t nc = std::min(kNC, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += kKC) {
      const int64_t kc = std::min(kKC, k - p0);
      PackB(b, p0, kc, j0, nc, bp);
      for (int64_t i0 = 0; i0 < m; i0 += kMC) {
        const int64_t mc = std::min(kMC, m - i0);
        PackA(a, i0, mc, p0, kc, ap);
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const int nr = static_cast<int>(std::min<int64_t>(kNR, nc - jr));
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            const int mr = static_cast<int>(std::min<int64_t>(kMR, mc - ir));
            MicroKernel(kc, ap + ir * kc, bp + jr * kc, c + (i0 + ir) * ldc + j0 + jr, ldc, mr, nr);
          }
        }
      }
    }
  }
}

}  // namespace mok::cpu
