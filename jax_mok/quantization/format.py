"""The FP8 formats of the MoE layer, ``"mxfp8"`` (OCP MX) and ``"fp8_block"`` (DeepSeek-V3): their
rules, and the element-level pieces that implement them.

Both recipes store values as ``float8_e4m3fn`` (largest finite 448, no infinity) with one scale
per block of consecutive elements. This module docstring is the specification: the functions of
:mod:`jax_mok.quantization.blocks` assemble this module's pieces into the public quantizers, the
CUDA kernels (ffi/cuda/device/fp8_format.cuh) reproduce them bit for bit, and the tests hold both
to a NumPy oracle. The pieces here are exact on every platform (bit-level where float arithmetic
could round or flush differently).

Common rules
  * Work in float32: ``x32 = x.astype(float32)`` (bfloat16 and float16 convert exactly).
  * Blocks run along a chosen axis (or two). A partial block at the end is padded with zeros:
    values keep x's shape, scales have ``ceil(n / block)`` entries along the blocked axis.
  * ``amax = max |x32|`` over the block.
  * Non-finite blocks: a block holding a NaN or an infinity gets a NaN scale (E8M0 byte 0xFF /
    float32 NaN) and every value of the block becomes the E4M3 NaN 0x7F. E4M3 has no infinity and
    no finite scale covers one, so an infinite input is reported as NaN rather than clipped.
  * Values are rounded to nearest even after clipping to ``[-448, 448]``; the sign of zero is
    kept.
  * Subnormal float32 inputs are values like any other (IEEE semantics, no flushing). XLA:CPU
    flushes subnormal operands of float arithmetic, so these pieces derive amax and exponents
    from the bits and scales subnormal inputs through their integer mantissa: the results are
    the same on every platform.

``"mxfp8"`` — block 32 along ``axis``, one E8M0 scale per block (byte ``e + 127``).
  ``e`` is the smallest integer with ``amax <= 448 * 2**e`` (so no value saturates), computed
  exactly from the bits of amax: with ``amax = m * 2**q``, ``m`` in ``[0.5, 1)``, ``e = q - 9``
  if ``m <= 0.875`` else ``q - 8``; clamped to ``[-127, 127]``; ``amax == 0`` (or subnormal)
  gives ``e = -127``. Values: ``x32 * 2**-e`` exactly, clipped, cast to E4M3 (RNE).
  Dequantize: ``values.astype(float32) * 2**e``, exact: every E4M3 value times ``2**e``,
  ``-127 <= e <= 127``, is a float32 (subnormal results included) unless ``|v| * 2**e >= 2**128``,
  which is infinity: from finite float32 input that happens only in blocks with ``e = 120`` whose
  values round to ``|v| >= 256``, i.e. ``|x| >= 248 * 2**120`` (about 3.3e38). Byte 0xFF
  dequantizes to NaN.

``"fp8_block"`` — float32 scales; activations in 1 x 128 blocks along the last axis, weights in
  128 x 128 blocks over the last two axes.
  ``scale = amax / 448`` (IEEE float32 division, round to nearest) where that quotient is at
  least ``2**-117``, else ``scale = 1.0`` (amax 0, or a block below ``448 * 2**-117 ≈ 2.7e-33``,
  which then quantizes to zeros). The bound keeps every dequantized value ``v * scale`` a normal
  float32, so no platform's subnormal flushing can change a bit.
  Values: ``x32 / scale`` (IEEE float32 division), clipped, cast to E4M3 (RNE).
  Dequantize: ``values.astype(float32) * scale`` (one float32 multiplication).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

RECIPES = ("mxfp8", "fp8_block")
E4M3_MAX = 448.0
MX_BLOCK = 32
BLOCK = 128
BLOCK_SHAPES = ((1, BLOCK), (BLOCK, BLOCK))
# The smallest fp8_block scale: 2**-117 * 2**-9 (the smallest E4M3 subnormal) = 2**-126, the
# smallest normal float32.
MIN_BLOCK_SCALE = 2.0**-117

NONFINITE_BITS = 0x7F800000  # |x| bits at or above this: infinity or NaN
_MANTISSA = 0x7FFFFF
_E4M3_NAN_BYTE = 0x7F
_E8M0_NAN_BYTE = 0xFF
_F32_NAN_BITS = 0x7FC00000


def check_recipe(recipe, name: str = "recipe") -> str:
    """Returns ``recipe`` if it is one of :data:`RECIPES`, else raises ValueError."""
    if recipe not in RECIPES:
        raise ValueError(f"{name} must be one of {RECIPES}, got {recipe!r}")
    return recipe


def check_float(x, fn: str, name: str = "x"):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{fn}: {name} must be an array, got {type(x).__name__}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{fn}: {name} must be a floating-point array, got dtype {x.dtype}")


def check_axis(axis, ndim: int, fn: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer) or not (
            -ndim <= axis < ndim):
        raise ValueError(f"{fn}: axis must be an int in [{-ndim}, {ndim}) for an array of "
                         f"{ndim} dims, got {axis!r}")
    return int(axis) % ndim


def check_block(block, ndim: int, fn: str) -> tuple[int, int]:
    block = tuple(block) if isinstance(block, tuple | list) else block
    if block not in BLOCK_SHAPES:
        raise ValueError(f"{fn}: block must be one of {BLOCK_SHAPES}, got {block!r}")
    need = 2 if block == (BLOCK, BLOCK) else 1
    if ndim < need:
        raise ValueError(f"{fn}: block={block} needs an array of at least {need} dims, got "
                         f"{ndim}")
    return block


# --- bit-level primitives (exact on every platform) -------------------------------------------

def to_float32(x: jax.Array) -> jax.Array:
    """``x`` as float32, exactly. bfloat16 widens through its bits (the top half of a float32),
    so subnormals survive platforms that flush them in arithmetic."""
    if x.dtype == jnp.bfloat16:
        wide = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32) << 16
        return jax.lax.bitcast_convert_type(wide, jnp.float32)
    return x.astype(jnp.float32)


def abs_bits(x32: jax.Array) -> jax.Array:
    """int32 bits of ``|x32|``: ordered like the magnitudes, NaN above infinity."""
    return jax.lax.bitcast_convert_type(x32, jnp.int32) & 0x7FFFFFFF


def _pow2(n: jax.Array) -> jax.Array:
    """float32 ``2**n`` for int32 ``n`` in ``[-126, 127]`` (built from the exponent bits)."""
    return jax.lax.bitcast_convert_type((n + 127) << 23, jnp.float32)


def _split_subnormal(x32: jax.Array):
    """``(subnormal, mantissa)``: whether ``x32`` is a zero or subnormal, and its 23-bit mantissa
    as a (positive, exactly representable) float32."""
    bits = jax.lax.bitcast_convert_type(x32, jnp.int32)
    subnormal = (bits & NONFINITE_BITS) == 0
    return subnormal, (bits & _MANTISSA).astype(jnp.float32), bits < 0


_E4M3_MAX_BITS = 0x43E00000  # float32 bits of 448
_E4M3_MIN_NORMAL_BITS = 121 << 23  # float32 bits of 2**-6, E4M3's smallest normal


def _cast_e4m3(scaled: jax.Array, nonfinite: jax.Array) -> jax.Array:
    """E4M3 bytes of ``clip(scaled, +-448)`` rounded to nearest even, from the float32 bits:
    integer arithmetic only, so every platform gives these bits (XLA:GPU's float32 -> float8
    conversion does not: it rounds some values differently). Where ``nonfinite``: NaN (0x7F)."""
    bits = jax.lax.bitcast_convert_type(scaled, jnp.int32)
    sign = jax.lax.shift_right_logical(bits, 31) << 7
    mag = jnp.minimum(bits & 0x7FFFFFFF, _E4M3_MAX_BITS)  # the clip, on ordered magnitudes
    # Normal: keep 3 of the 23 mantissa bits (RNE on exponent | mantissa, so a carry bumps the
    # exponent), then rebias the exponent from 127 to 7 (the field sits at bit 3).
    lsb = jax.lax.shift_right_logical(mag, 20) & 1
    normal = jax.lax.shift_right_logical(mag + 0x7FFFF + lsb, 20) - (120 << 3)
    # Below 2**-6: the value in units of E4M3's subnormal step 2**-9 is M * 2**(E - 14) with
    # M the 24-bit significand and E the unbiased exponent; rounded to nearest even it is the
    # byte itself (8 being 2**-6, the smallest normal). Below 2**-10 it rounds to 0 (shift 25:
    # M < 2**24 is under half a step); float32 subnormals (field 0) likewise.
    significand = (mag & _MANTISSA) | 0x800000
    shift = jnp.clip(14 - (jax.lax.shift_right_logical(mag, 23) - 127), 21, 25)
    half = jax.lax.shift_left(jnp.int32(1), shift - 1)
    odd = jax.lax.shift_right_logical(significand, shift) & 1
    sub = jax.lax.shift_right_logical(significand + half - 1 + odd, shift)
    byte = jnp.where(mag >= _E4M3_MIN_NORMAL_BITS, normal, sub) | sign
    byte = jnp.where(nonfinite, _E4M3_NAN_BYTE, byte).astype(jnp.uint8)
    return jax.lax.bitcast_convert_type(byte, jnp.float8_e4m3fn)


def mx_exponent(amax_bits: jax.Array) -> jax.Array:
    """int32 E8M0 exponent ``e`` in ``[-127, 127]`` of blocks with ``|amax|`` bits ``amax_bits``
    (meaningless where the block is non-finite)."""
    field = amax_bits >> 23
    mantissa = amax_bits & _MANTISSA
    # amax = m * 2**q with q = field - 126 and m = (1 + mantissa / 2**23) / 2; m <= 0.875 is
    # mantissa <= 0.75 * 2**23.
    e = field - 126 - jnp.where(mantissa <= 0x600000, 9, 8)
    return jnp.where(field == 0, -127, jnp.clip(e, -127, 127)).astype(jnp.int32)


def mx_values(x32: jax.Array, e: jax.Array, nonfinite: jax.Array) -> jax.Array:
    """E4M3 values ``RNE(clip(x32 * 2**-e))`` (``e``, ``nonfinite`` broadcast to ``x32``)."""
    subnormal, mantissa, negative = _split_subnormal(x32)
    # 2**-e is a normal float32 (-e in [-127, 127]; e = 127 only past float32's range), so the
    # product of a normal input is exact unless it is below 2**-126, far under E4M3's smallest
    # half-subnormal 2**-10: such a product becomes +-0 whether or not it is flushed.
    normal_part = x32 * _pow2(jnp.clip(-e, -126, 127))
    # A subnormal input is mantissa * 2**-149. Where that scales into E4M3's range (e <= -23),
    # 2**(-149 - e) is a normal float32 and the product exact; elsewhere the result is below
    # 2**-103 and rounds to zero either way.
    sub_part = mantissa * _pow2(jnp.maximum(-149 - e, -126))
    sub_part = jnp.where(negative, -sub_part, sub_part)
    return _cast_e4m3(jnp.where(subnormal, sub_part, normal_part), nonfinite)


def mx_dequantize_values(values: jax.Array, e: jax.Array) -> jax.Array:
    """float32 ``values * 2**e`` assembled from the bits (exact, subnormal results included);
    ``e`` int32 broadcast to ``values``, NaN where the scale byte was 0xFF (pass ``e = 128``)."""
    byte = jax.lax.bitcast_convert_type(values, jnp.uint8).astype(jnp.int32)
    field = (byte >> 3) & 15
    mantissa = byte & 7
    # |v| = k * 2**-9 with k < 2**18: normal (8 + m) * 2**(field - 10), subnormal m * 2**-9.
    k = jnp.where(field > 0, (8 + mantissa) << jnp.maximum(field - 1, 0), mantissa)
    shift = e - 9  # |v| * 2**e = k * 2**shift
    k_bits = jax.lax.bitcast_convert_type(k.astype(jnp.float32), jnp.int32)  # exact: k < 2**24
    biased = (k_bits >> 23) + shift
    normal = (biased << 23) | (k_bits & _MANTISSA)
    # Below 2**-126 the result is k * 2**shift = (k << (shift + 149)) * 2**-149 exactly: it is a
    # subnormal, and shift + 149 >= 13 since e >= -127.
    subnormal = k << jnp.clip(shift + 149, 0, 31)
    bits = jnp.where(biased >= 255, NONFINITE_BITS, jnp.where(biased >= 1, normal, subnormal))
    bits = jnp.where(k == 0, 0, bits) | ((byte >> 7) << 31)
    bits = jnp.where(((byte & 0x7F) == _E4M3_NAN_BYTE) | (e > 127), _F32_NAN_BITS, bits)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _div_rn(num: jax.Array, den: jax.Array) -> jax.Array:
    """``num / den`` rounded to nearest even as IEEE float32 division does, from integer
    arithmetic: XLA does not give the correctly rounded quotient everywhere (constant and
    broadcast divisors become reciprocal multiplications, and XLA:GPU's division differs near
    ties; seen on an H200). ``num`` float32 zero or normal, ``den`` positive normal float32 (both
    finite); a quotient below 2**-126 gives ``+-0`` (its callers round such values to E4M3's zero,
    or compare them with 2**-117)."""
    nb = jax.lax.bitcast_convert_type(num, jnp.int32)
    db = jax.lax.bitcast_convert_type(den, jnp.int32)
    sign = nb & jnp.int32(-0x80000000)
    na = nb & 0x7FFFFFFF
    n_sig = (na & _MANTISSA) | 0x800000  # 24-bit significands
    d_sig = (db & _MANTISSA) | 0x800000
    exponent = jax.lax.shift_right_logical(na, 23) - jax.lax.shift_right_logical(db, 23)
    # floor(n_sig * 2**28 / d_sig) by long division, 7 bits a step (remainder << 7 < 2**31).
    quotient = jnp.zeros_like(na)
    remainder = n_sig
    for _ in range(4):
        remainder = remainder << 7
        quotient = (quotient << 7) | jax.lax.div(remainder, d_sig)
        remainder = jax.lax.rem(remainder, d_sig)
    # n_sig / d_sig in [1, 2): quotient in [2**28, 2**29), keep its top 24 bits (shift 5); in
    # (1/2, 1): [2**27, 2**28), shift 4 and one less in the exponent.
    big = quotient >= (1 << 28)
    shift = jnp.where(big, 5, 4)
    exponent = exponent + jnp.where(big, 127, 126)  # biased
    keep = jax.lax.shift_right_logical(quotient, shift)
    dropped = quotient & (jax.lax.shift_left(jnp.int32(1), shift) - 1)
    half = jax.lax.shift_left(jnp.int32(1), shift - 1)
    up = (dropped > half) | ((dropped == half) & ((remainder != 0) | ((keep & 1) == 1)))
    keep = keep + up.astype(jnp.int32)
    carry = keep >= (1 << 24)  # rounded up to the next power of two
    keep = jnp.where(carry, 1 << 23, keep)
    exponent = exponent + carry.astype(jnp.int32)
    bits = (exponent << 23) | (keep & _MANTISSA)
    bits = jnp.where((na == 0) | (exponent < 1), 0, bits) | sign
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def block_scale(amax_bits: jax.Array) -> jax.Array:
    """float32 fp8_block scale of blocks with ``|amax|`` bits ``amax_bits`` (NaN if non-finite)."""
    nonfinite = amax_bits >= NONFINITE_BITS
    # A subnormal amax (exponent field 0) has a quotient far below 2**-117: scale 1 either way.
    normal = jnp.where((amax_bits >> 23) > 0, amax_bits, 0)
    amax = jax.lax.bitcast_convert_type(normal, jnp.float32)
    quotient = _div_rn(amax, jnp.full_like(amax, E4M3_MAX))
    nan = jax.lax.bitcast_convert_type(jnp.int32(_F32_NAN_BITS), jnp.float32)
    return jnp.where(nonfinite, nan,
                     jnp.where(quotient >= MIN_BLOCK_SCALE, quotient, jnp.float32(1.0)))


def block_values(x32: jax.Array, scale: jax.Array) -> jax.Array:
    """E4M3 values ``RNE(clip(x32 / scale))`` (``scale`` broadcast to ``x32``; NaN scale ->
    NaN values)."""
    subnormal, mantissa, negative = _split_subnormal(x32)
    nan_scale = jnp.isnan(scale)
    divisor = jnp.broadcast_to(jnp.where(nan_scale, jnp.float32(1.0), scale), x32.shape)
    normal_part = _div_rn(jnp.where(subnormal, jnp.float32(0.0), x32), divisor)
    # Subnormal x = (mantissa * 2**-24) * 2**-125: dividing the normal first factor rounds once,
    # and the power-of-two factor is exact wherever the result can reach E4M3's range.
    sub_part = _div_rn(mantissa * jnp.float32(2.0**-24), divisor) * jnp.float32(2.0**-125)
    sub_part = jnp.where(negative, -sub_part, sub_part)
    return _cast_e4m3(jnp.where(subnormal, sub_part, normal_part), nan_scale)


def block_dequantize_values(values: jax.Array, scale: jax.Array) -> jax.Array:
    """float32 ``values * scale`` (``scale`` broadcast), canonical NaN where either is NaN."""
    v = values.astype(jnp.float32)
    product = v * scale
    nan = jax.lax.bitcast_convert_type(jnp.int32(_F32_NAN_BITS), jnp.float32)
    return jnp.where(jnp.isnan(v) | jnp.isnan(scale), nan, product)


def e8m0_from_exponent(e: jax.Array, nonfinite: jax.Array) -> jax.Array:
    byte = jnp.where(nonfinite, _E8M0_NAN_BYTE, e + 127).astype(jnp.uint8)
    return jax.lax.bitcast_convert_type(byte, jnp.float8_e8m0fnu)


def exponent_from_e8m0(scales: jax.Array) -> jax.Array:
    """int32 ``e`` of E8M0 scales; 128 for the NaN byte 0xFF."""
    return jax.lax.bitcast_convert_type(scales, jnp.uint8).astype(jnp.int32) - 127


def fake_quantize_with_amax(x32: jax.Array, amax_bits: jax.Array, recipe: str) -> jax.Array:
    """float32 ``deq(Q(x32))`` where each element's block has ``|amax|`` bits ``amax_bits``
    (broadcast to ``x32``): the format's element rules for blocks of any shape."""
    nonfinite = amax_bits >= NONFINITE_BITS
    if recipe == "mxfp8":
        e = mx_exponent(amax_bits)
        values = mx_values(x32, e, nonfinite)
        return mx_dequantize_values(values, jnp.where(nonfinite, 128, e))
    scale = block_scale(amax_bits)
    return block_dequantize_values(block_values(x32, scale), scale)
