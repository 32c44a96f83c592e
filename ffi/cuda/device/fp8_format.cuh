// The two FP8 formats of MoEConfig.quantization, element by element, exactly as
// jax_mok/quantization/format.py defines them (the GPU tests compare these kernels' bits with it):
//   mxfp8     : E4M3 values, one E8M0 scale 2^e per 32 elements along the reduction axis; e is the
//               smallest integer with amax <= 448 * 2^e (from the bits of amax, no log2), clamped
//               to [-127, 127], -127 for amax = 0; value = RNE_e4m3(clip(x * 2^-e, +-448)).
//   fp8_block : E4M3 values, one float32 scale per block (1x128 activations, 128x128 weights):
//               scale = amax / 448 where that is >= 2^-117, else 1; value = RNE_e4m3(clip(x /
//               scale)) (IEEE division).
// A NaN or an infinity in a block makes the block's scale NaN (E8M0 0xFF, float32 0x7FC00000) and
// every value of the block the E4M3 NaN 0x7F. Subnormal inputs are values like any other: these
// kernels do not flush (nvcc's default), so plain float32 arithmetic gives the specified bits.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace mok::cuda::fp8 {

// The Python attribute `recipe` (jax_mok/kernels/targets.py).
enum class Recipe : int { kMx = 1, kBlock = 2 };

// Elements per scale along the reduction axis.
template <Recipe R>
constexpr int kScaleBlock = R == Recipe::kMx ? 32 : 128;

// Both recipes store 4 scale bytes per 128 reduction elements (4 E8M0 bytes, or one float32), so
// a row of scales is K / 32 bytes and the scales of one 128-wide k-block are one 32-bit word.
constexpr int kScaleBytesPerK128 = 4;

// max(a, b) that keeps a NaN once seen (fmaxf would drop it): PTX max.NaN, one instruction (a
// compare-and-select took three). A NaN amax only ever makes its block's scale NaN
// (block_scale), so the canonical NaN max.NaN returns serves as well as the input's own.
__device__ __forceinline__ float max_keep_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
// A running amax: max(m, |v|).
__device__ __forceinline__ float amax_combine(float m, float v) {
  return max_keep_nan(m, fabsf(v));
}

// The max over the 4 lanes of a quad (the lanes holding one row of a wgmma accumulator tile).
__device__ __forceinline__ float quad_amax(float m) {  // m >= 0 or NaN in every lane
  m = max_keep_nan(m, __shfl_xor_sync(0xffffffffu, m, 1));
  return max_keep_nan(m, __shfl_xor_sync(0xffffffffu, m, 2));
}

__device__ __forceinline__ float e8m0_to_float(uint32_t byte) {
  if (byte == 0xFFu) return __int_as_float(0x7FC00000);  // NaN
  if (byte == 0u) return __int_as_float(0x00400000);     // 2^-127 (a float32 subnormal)
  return __int_as_float(static_cast<int>(byte) << 23);
}

// The E8M0 exponent e of an mxfp8 block with max |x| = amax (finite, >= 0): the smallest e with
// amax <= 448 * 2^e. With amax = m * 2^q, m in [0.5, 1): e = q - 9 when m <= 0.875, else q - 8.
__device__ __forceinline__ int mx_exponent(float amax) {
  if (amax == 0.f) return -127;
  const uint32_t bits = __float_as_uint(amax);
  int biased = static_cast<int>(bits >> 23);
  uint32_t frac = bits & 0x7FFFFFu;
  if (biased == 0) {  // subnormal: normalise the fraction (its leading one becomes implicit)
    const int lead = 31 - __clz(frac);
    frac = (frac << (23 - lead)) & 0x7FFFFFu;
    biased = lead - 22;
  }
  const int q = biased - 126;                       // amax = (1.frac / 2) * 2^q
  const int e = frac <= 0x600000u ? q - 9 : q - 8;  // 1.frac <= 1.75  <=>  m <= 0.875
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

// How one block's values are scaled, from its amax.
struct BlockScale {
  float mul = 1.f;           // mxfp8: x * mul, mul = 2^-e
  float div = 1.f;           // fp8_block: x / div, div = the stored scale
  float lo = 1.f, hi = 1.f;  // fp8_block: x * lo and x * hi bracket RN(x / div) (quantize_pair)
  uint32_t stored = 0;       // mxfp8: the E8M0 byte; fp8_block: the float32 bits
  bool nonfinite = false;    // a NaN or an infinity in the block
};

constexpr float kMinBlockScale = 0x1p-117f;  // keeps every dequantized fp8_block value normal

template <Recipe R>
__device__ __forceinline__ BlockScale block_scale(float amax) {
  BlockScale s;
  s.nonfinite = !(amax <= 3.4028235e38f);
  if constexpr (R == Recipe::kMx) {
    if (s.nonfinite) {
      s.stored = 0xFFu;
    } else {
      const int e = mx_exponent(amax);
      s.mul = __int_as_float((127 - e) << 23);  // e <= 120 for finite float32 amax
      s.stored = static_cast<uint32_t>(e + 127);
    }
  } else {
    const float scale = amax / 448.f;
    s.div = s.nonfinite ? __int_as_float(0x7FC00000) : (scale >= kMinBlockScale ? scale : 1.f);
    s.stored = __float_as_uint(s.div);
    const float r = 1.f / s.div;  // RN(1 / div): normal, since 2^-117 <= div < 2^120
    s.lo = r * (1.f - 0x1p-21f);
    s.hi = r * (1.f + 0x1p-21f);
  }
  return s;
}

__device__ __forceinline__ uint16_t e4m3x2(float x, float y) {
  return static_cast<uint16_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3));
}

// Two adjacent values to two E4M3 bytes (low byte = v.x), round to nearest even, saturating.
// fp8_block without the IEEE division on the common path: with u = 2^-24 and Q = |x| / div,
//   |x| lo <= Q (1+u)^3 (1-8u) < Q (1-u) <= RN(Q) <= Q (1+u) < Q (1-u)^3 (1+8u) <= |x| hi
// (each factor (1 +- u) one rounding: of 1/div, of lo or hi, of the product), wherever Q is a
// normal float32; where it is not, all three round to a zero of x's sign. E4M3 rounding is
// monotonic in the magnitude, so when both ends give the same byte that is RN(Q)'s byte. They
// differ only within ~5u of an E4M3 rounding boundary (~2^-15 of the values): then divide.
template <Recipe R>
__device__ __forceinline__ uint16_t quantize_pair(float2 v, const BlockScale& s) {
  if (s.nonfinite) return 0x7F7Fu;
  if constexpr (R == Recipe::kMx) {
    return e4m3x2(v.x * s.mul, v.y * s.mul);  // a power of two: exact
  } else {
    const uint16_t lo = e4m3x2(v.x * s.lo, v.y * s.lo);
    if (lo == e4m3x2(v.x * s.hi, v.y * s.hi)) return lo;
    return e4m3x2(v.x / s.div, v.y / s.div);
  }
}

// quantize_pair without its slow path: the byte pair of the bracket's low end, and in `differs`
// (OR-ed in) the bits where the two ends disagree. mxfp8 is exact and never sets `differs`.
template <Recipe R>
__device__ __forceinline__ uint16_t quantize_pair_bracket(float2 v, const BlockScale& s,
                                                          uint32_t& differs) {
  if constexpr (R == Recipe::kMx) {
    return s.nonfinite ? 0x7F7Fu : e4m3x2(v.x * s.mul, v.y * s.mul);
  } else {
    const uint16_t lo = e4m3x2(v.x * s.lo, v.y * s.lo);
    differs |= lo ^ e4m3x2(v.x * s.hi, v.y * s.hi);
    return s.nonfinite ? 0x7F7Fu : lo;
  }
}

// N pairs, pair j = pair(j) with scale scale(j), each handed to store(j, bytes): every pair by
// the bracket (no branch per pair), then, only where one of them lies at an E4M3 rounding
// boundary (about one pair in 2^14), all N again by quantize_pair, stored over the first. What
// is stored last for each j is quantize_pair's.
template <Recipe R, int N, class Pair, class Scale, class Store>
__device__ __forceinline__ void quantize_pairs(Pair&& pair, Scale&& scale, Store&& store) {
  uint32_t differs = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) store(j, quantize_pair_bracket<R>(pair(j), scale(j), differs));
  if (differs) {
#pragma unroll
    for (int j = 0; j < N; ++j) store(j, quantize_pair<R>(pair(j), scale(j)));
  }
}

// deq(Q(v)) of an mxfp8 pair: its E4M3 bytes (quantize_pair) times the block's 2^e, in float32.
// Exact: an E4M3 value has at most 4 significant bits and is at least 2^-9 in magnitude, so with
// 2^e >= 2^-127 the product is at least 2^-136 and needs no bit below float32's 2^-149. (A bf16
// store of it is exact too while the product is >= 2^-133, bf16's least subnormal: every block
// with e >= -124.) A non-finite block gives NaN, as its E4M3 NaN bytes dequantize.
__device__ __forceinline__ float2 mx_qdq_pair(float2 v, const BlockScale& s) {
  const uint16_t q = quantize_pair<Recipe::kMx>(v, s);
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(q), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));  // every E4M3 value is a float16 value
  const float scale = e8m0_to_float(s.stored);
  return make_float2(f.x * scale, f.y * scale);
}

// The float32 factor of one stored scale (for the GEMMs' promotion).
template <Recipe R>
__device__ __forceinline__ float scale_value(uint32_t stored) {
  if constexpr (R == Recipe::kMx)
    return e8m0_to_float(stored & 0xFFu);
  else
    return __uint_as_float(stored);
}

}  // namespace mok::cuda::fp8
