// bf16 <-> f32 conversions and the strided, optionally gathered matrix views the CPU kernels
// pack from. Packing is where gathers, transposes and dtype conversion happen, so the GEMM
// micro-kernel only ever sees contiguous float32 panels.
#pragma once

#include <cstdint>
#include <cstring>

namespace mok::cpu {

inline float Bf16ToF32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, NaN stays NaN (quiet), like XLA's convert.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

enum class Dtype { kF32, kBF16 };

// Element (i, j) lives at ptr[row(i) * row_stride + col(j) * col_stride], where row(i) is
// rows[i] when a gather index is given and i otherwise (same for columns).
struct MatView {
  const void* ptr = nullptr;
  Dtype dtype = Dtype::kF32;
  int64_t row_stride = 0;
  int64_t col_stride = 0;
  const int64_t* rows = nullptr;
  const int64_t* cols = nullptr;

  float At(int64_t i, int64_t j) const {
    int64_t r = rows ? rows[i] : i;
    int64_t c = cols ? cols[j] : j;
    int64_t off = r * row_stride + c * col_stride;
    return dtype == Dtype::kF32 ? static_cast<const float*>(ptr)[off]
                                : Bf16ToF32(static_cast<const uint16_t*>(ptr)[off]);
  }
  // The transpose of this view (no data moves).
  MatView T() const { return MatView{ptr, dtype, col_stride, row_stride, cols, rows}; }
};

inline MatView RowMajor(const void* ptr, Dtype dtype, int64_t ld) {
  return MatView{ptr, dtype, ld, 1, nullptr, nullptr};
}

}  // namespace mok::cpu
