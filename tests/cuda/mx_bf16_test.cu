// mxfp8 as bf16 (ffi/cuda/device/fp8_format.cuh, used by fp8_gemm.cuh's kMxBf16), run on the CPU:
//  - e4m3x2_bf16x2_unscaled gives, for every E4M3 byte pair but the NaN 0x7F / 0xFF, the two
//    values times 2^-120 exactly as bf16 (zero and the subnormals included);
//  - e8m0_bf16_factors' factors multiply to 2^(e + 120) for every E8M0 byte (the second is 1
//    unless needed), NaN for 0xFF;
//  - the scaled value, rounded to bf16 after each factor as the GPU's bf16 multiply does, is the
//    E4M3 value times 2^e exactly for every byte and every e >= -124 whose product is finite;
//  - fp8_cvt_offset is CuTe's address of element (row, k) in GMMA::Layout_K_SW64_Atom<bf16> tiled
//    to the slots' shape, for every row, k-chunk and slot (the wgmma descriptors read that layout).
// Exit status 1 and a line naming the first failure. Built and run by tests/test_mx_bf16.py.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cuda/device/fp8_format.cuh"

namespace {

using mok::cuda::fp8::Bf16Factors;
using mok::cuda::fp8::e4m3x2_bf16x2_unscaled;
using mok::cuda::fp8::e8m0_bf16_factors;
using mok::cuda::fp8::fp8_cvt_offset;

double e4m3_value(uint32_t b) {  // the OCP E4M3 (fn) decoding, from its definition
  const int s = (b >> 7) & 1, e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

double bf16_value(uint32_t bits) {  // bits 0-15
  uint32_t f = (bits & 0xFFFFu) << 16;
  float x;
  std::memcpy(&x, &f, 4);
  return x;
}

// The bf16 nearest x (ties to even), as the GPU's mul.rn.bf16x2 rounds; x finite.
uint32_t to_bf16(double x) {
  const float f = static_cast<float>(x);  // exact below: every checked product fits float
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return rounded >> 16;
}

int fail(const char* what, long a, long b) {
  std::printf("FAIL %s (%ld, %ld)\n", what, a, b);
  return 1;
}

}  // namespace

int main() {
  // 1. the unscaled bf16 of every byte, in both halves
  for (uint32_t b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;  // NaN: its block's factor is NaN (below)
    for (int half = 0; half < 2; ++half) {
      // byte b at position 2 h + half of a word, beside 1.0 (0x38), the other pair 0x00 0x80
      for (int h = 0; h < 2; ++h) {
        const uint32_t two = half ? (b << 8) | 0x38u : b | (0x38u << 8);
        const uint32_t word = h == 0 ? two | (0x8000u << 16) : (two << 16) | 0x8000u;
        const uint32_t r = e4m3x2_bf16x2_unscaled(word, h);
        const uint32_t mine = half ? r >> 16 : r & 0xFFFFu, other = half ? r & 0xFFFFu : r >> 16;
        if (bf16_value(mine) != std::ldexp(e4m3_value(b), -120)) return fail("unscaled", b, half);
        if (bf16_value(other) != std::ldexp(1.0, -120)) return fail("unscaled neighbour", b, h);
      }
    }
  }
  // 2. the factors
  for (uint32_t s = 0; s < 256; ++s) {
    const Bf16Factors f = e8m0_bf16_factors(s);
    if ((f.f1 >> 16) != (f.f1 & 0xFFFFu) || (f.f2 >> 16) != (f.f2 & 0xFFFFu))
      return fail("factor halves", s, 0);
    if (s == 0xFF) {
      if (!std::isnan(bf16_value(f.f1))) return fail("NaN factor", s, 0);
      continue;
    }
    const double want = std::ldexp(1.0, static_cast<int>(s) - 127 + 120);
    if (!f.two && bf16_value(f.f2) != 1.0) return fail("second factor not 1", s, 0);
    if (bf16_value(f.f1) * bf16_value(f.f2) != want) return fail("factor", s, 0);
    if (f.two != (s > 134)) return fail("two factors", s, 0);
  }
  // 3. the scaled values: each multiply rounds to bf16, the result is v 2^e exactly
  int checked = 0;
  for (uint32_t s = 3; s < 255; ++s) {  // e >= -124
    const Bf16Factors f = e8m0_bf16_factors(s);
    const int e = static_cast<int>(s) - 127;
    for (uint32_t b = 0; b < 256; ++b) {
      if ((b & 0x7F) == 0x7F) continue;
      const double want = std::ldexp(e4m3_value(b), e);
      if (std::fabs(want) >= 3.3895313892515355e38) continue;  // beyond bf16's largest finite
      uint32_t r = to_bf16(bf16_value(e4m3x2_bf16x2_unscaled(b, 0) & 0xFFFFu) * bf16_value(f.f1));
      r = to_bf16(bf16_value(r) * bf16_value(f.f2));  // 1 unless two: a warp may always
      if (bf16_value(r) != want) return fail("scaled", b, s);
      ++checked;
    }
  }
  // 4. the slots' layout against CuTe's
  {
    using namespace cute;
    using Bf = cute::bfloat16_t;
    constexpr int kRows[2] = {128, 256};
    alignas(1024) static Bf buf[256 * 32 * 3];
    auto check = [&](auto layout, int rows) {
      Tensor tensor = make_tensor(make_smem_ptr(buf), layout);
      for (int slot = 0; slot < 3; ++slot)
        for (int row = 0; row < rows; ++row)
          for (int k = 0; k < 32; k += 8) {
            const long got = reinterpret_cast<const char*>(&tensor(row, k, slot)) -
                             reinterpret_cast<const char*>(buf) - slot * rows * 64;
            if (got != static_cast<long>(fp8_cvt_offset(row, k))) return fail("layout", row, k);
            // the chunk's 8 elements are contiguous
            for (int i = 1; i < 8; ++i)
              if (&tensor(row, k + i, slot) != &tensor(row, k, slot) + i)
                return fail("chunk", row, k + i);
          }
      return 0;
    };
    using A = decltype(tile_to_shape(GMMA::Layout_K_SW64_Atom<Bf>{}, Shape<_128, _32, _3>{}));
    using B = decltype(tile_to_shape(GMMA::Layout_K_SW64_Atom<Bf>{}, Shape<_256, _32, _3>{}));
    if (check(A{}, kRows[0]) || check(B{}, kRows[1])) return 1;
  }
  std::printf("ok: 256 bytes, 256 scales, %d scaled values, 2 slot layouts\n", checked);
  return 0;
}
