"""The public FP8 quantizers: whole arrays blocked along their axes, quantized and dequantized
by the rules of :mod:`jax_mok.quantization.format` (its docstring is the specification), the
pre-quantized weight :class:`QuantizedWeight`, and the checks and casts of expert weights that
the layers share (:func:`check_weights`, :func:`cast_weight`).

Layout of pre-quantized weights (:class:`QuantizedWeight`): values with the GEMM's reduction axis
LAST (``w_gate_up [E, H, 2F]`` quantized along H is stored ``[E, 2F, H]``), scales likewise
(mxfp8 ``[E, 2F, ceil(H/32)]``; fp8_block ``[E, ceil(2F/128), ceil(H/128)]``).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from jax_mok.quantization.format import (
    BLOCK,
    MX_BLOCK,
    NONFINITE_BITS,
    abs_bits,
    block_dequantize_values,
    block_scale,
    block_values,
    check_axis,
    check_block,
    check_float,
    check_recipe,
    e8m0_from_exponent,
    exponent_from_e8m0,
    mx_dequantize_values,
    mx_exponent,
    mx_values,
    to_float32,
)

# --- blocking along axes ----------------------------------------------------------------------

def _blocks_last(x: jax.Array, block: int) -> jax.Array:
    """``[..., n]`` -> ``[..., ceil(n / block), block]``, zero-padded."""
    n = x.shape[-1]
    pad = -n % block
    if pad:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    return x.reshape(*x.shape[:-1], (n + pad) // block, block)


def _unblock_last(blocked: jax.Array, n: int) -> jax.Array:
    return blocked.reshape(*blocked.shape[:-2], -1)[..., :n]


def _tiles(x: jax.Array, block: int) -> jax.Array:
    """``[..., r, c]`` -> ``[..., ceil(r/b), b, ceil(c/b), b]``, zero-padded."""
    r, c = x.shape[-2:]
    pads = [(0, 0)] * (x.ndim - 2) + [(0, -r % block), (0, -c % block)]
    x = jnp.pad(x, pads)
    return x.reshape(*x.shape[:-2], x.shape[-2] // block, block, x.shape[-1] // block, block)


def _untile(tiled: jax.Array, r: int, c: int) -> jax.Array:
    lead = tiled.shape[:-4]
    rows = tiled.shape[-4] * tiled.shape[-3]
    return tiled.reshape(*lead, rows, -1)[..., :r, :c]


def _amax_bits(blocks: jax.Array, axis) -> jax.Array:
    """int32 float32 bits of ``max |blocks|`` over ``axis`` (``blocks`` in x's dtype). bfloat16
    reduces its own 16 bits (ordered like the magnitudes, NaN above infinity; the float32 bits
    are them shifted up 16), so the float32 copy of x has one consumer, the elementwise pass,
    and XLA need not materialize it."""
    if blocks.dtype == jnp.bfloat16:
        bits16 = jax.lax.bitcast_convert_type(blocks, jnp.uint16).astype(jnp.int32) & 0x7FFF
        return jnp.max(bits16, axis=axis) << 16
    return jnp.max(abs_bits(to_float32(blocks)), axis=axis)


def quantize_mxfp8(x: jax.Array, axis: int = -1) -> tuple[jax.Array, jax.Array]:
    """OCP MXFP8: ``(values, scales)``, blocks of 32 along ``axis`` (the format's rules).

    Args:
      x: floating-point array of any shape.
      axis: the blocked axis (the GEMM's reduction axis).

    Returns:
      ``values``: ``float8_e4m3fn``, x's shape. ``scales``: ``float8_e8m0fnu``, x's shape with
      ``ceil(n / 32)`` along ``axis``.
    """
    check_float(x, "quantize_mxfp8")
    return _quantize_mxfp8(x, check_axis(axis, x.ndim, "quantize_mxfp8"))


@functools.partial(jax.jit, static_argnums=1)
def _quantize_mxfp8(x, axis: int):
    # Blocks are formed in place (``[..., n, ...]`` -> ``[..., n/32, 32, ...]``), never by moving
    # ``axis`` last: a transpose of the float32 copy is a full-size intermediate that XLA
    # materializes (a weight quantized along a middle axis ran out of memory that way), while the
    # in-place reduction and the elementwise pass read x as it lies.
    n = x.shape[axis]
    pad = -n % MX_BLOCK
    if pad:
        x = jnp.pad(x, [(0, pad if i == axis else 0) for i in range(x.ndim)])
    shape = x.shape
    blocks = x.reshape(*shape[:axis], shape[axis] // MX_BLOCK, MX_BLOCK, *shape[axis + 1:])
    amax_bits = _amax_bits(blocks, axis + 1)  # [..., nb, ...]
    nonfinite = amax_bits >= NONFINITE_BITS
    e = mx_exponent(amax_bits)
    values = mx_values(to_float32(blocks), jnp.expand_dims(e, axis + 1),
                       jnp.expand_dims(nonfinite, axis + 1))
    values = jax.lax.slice_in_dim(values.reshape(shape), 0, n, axis=axis)
    return values, e8m0_from_exponent(e, nonfinite)


def _check_dequantize(values, scales, fn, scale_dtype, expected_scales):
    check_float(values, fn, "values")
    if values.dtype != jnp.float8_e4m3fn:
        raise TypeError(f"{fn}: values must be float8_e4m3fn, got {values.dtype}")
    if not hasattr(scales, "dtype") or scales.dtype != scale_dtype:
        raise TypeError(f"{fn}: scales must be {jnp.dtype(scale_dtype).name}, got "
                        f"{getattr(scales, 'dtype', type(scales).__name__)}")
    if tuple(scales.shape) != tuple(expected_scales):
        raise ValueError(f"{fn}: scales must have shape {tuple(expected_scales)} for values of "
                         f"shape {tuple(values.shape)}, got {tuple(scales.shape)}")


def dequantize_mxfp8(values: jax.Array, scales: jax.Array, axis: int = -1,
                     dtype=jnp.float32) -> jax.Array:
    """``values * 2**e`` in ``dtype`` (exact in float32), the inverse of :func:`quantize_mxfp8`.

    ``values`` ``float8_e4m3fn`` of any shape, ``scales`` ``float8_e8m0fnu`` with
    ``ceil(n / 32)`` entries along ``axis``.
    """
    fn = "dequantize_mxfp8"
    check_float(values, fn, "values")
    axis = check_axis(axis, values.ndim, fn)
    n = values.shape[axis]
    expected = (*values.shape[:axis], -(-n // MX_BLOCK), *values.shape[axis + 1:])
    _check_dequantize(values, scales, fn, jnp.float8_e8m0fnu, expected)
    return _dequantize_mxfp8(values, scales, axis, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _dequantize_mxfp8(values, scales, axis: int, dtype):
    n = values.shape[axis]
    e = jnp.repeat(exponent_from_e8m0(scales), MX_BLOCK, axis=axis,
                   total_repeat_length=scales.shape[axis] * MX_BLOCK)
    e = jax.lax.slice_in_dim(e, 0, n, axis=axis)
    return mx_dequantize_values(values, e).astype(dtype)


def quantize_fp8_block(x: jax.Array, block=(1, BLOCK)) -> tuple[jax.Array, jax.Array]:
    """DeepSeek-V3 block FP8: ``(values, scales)`` (the format's rules).

    Args:
      x: floating-point array. ``block=(1, 128)``: blocks of 128 along the last axis (at least
        1 dim); ``block=(128, 128)``: 128 x 128 tiles over the last two axes (at least 2 dims).

    Returns:
      ``values``: ``float8_e4m3fn``, x's shape. ``scales``: float32, ``[..., ceil(n/128)]`` or
      ``[..., ceil(r/128), ceil(c/128)]``.
    """
    check_float(x, "quantize_fp8_block")
    return _quantize_fp8_block(x, check_block(block, x.ndim, "quantize_fp8_block"))


@functools.partial(jax.jit, static_argnums=1)
def _quantize_fp8_block(x, block: tuple[int, int]):
    n = x.shape[-1]
    if block == (1, BLOCK):
        blocks = _blocks_last(x, BLOCK)
        scale = block_scale(_amax_bits(blocks, -1))  # [..., nb]
        return _unblock_last(block_values(to_float32(blocks), scale[..., None]), n), scale
    tiles = _tiles(x, BLOCK)  # [..., nr, 128, nc, 128]
    scale = block_scale(_amax_bits(tiles, (-3, -1)))  # [..., nr, nc]
    values = block_values(to_float32(tiles), scale[..., :, None, :, None])
    return _untile(values, *x.shape[-2:]), scale


def dequantize_fp8_block(values: jax.Array, scales: jax.Array, block=(1, BLOCK),
                         dtype=jnp.float32) -> jax.Array:
    """``values * scale`` in ``dtype``, the inverse of :func:`quantize_fp8_block` (same
    ``block``)."""
    fn = "dequantize_fp8_block"
    check_float(values, fn, "values")
    block = check_block(block, values.ndim, fn)
    if block == (1, BLOCK):
        expected = (*values.shape[:-1], -(-values.shape[-1] // BLOCK))
    else:
        r, c = values.shape[-2:]
        expected = (*values.shape[:-2], -(-r // BLOCK), -(-c // BLOCK))
    _check_dequantize(values, scales, fn, jnp.float32, expected)
    return _dequantize_fp8_block(values, scales, block, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _dequantize_fp8_block(values, scales, block: tuple[int, int], dtype):
    if block == (1, BLOCK):
        out = block_dequantize_values(_blocks_last(values, BLOCK), scales[..., None])
        return _unblock_last(out, values.shape[-1]).astype(dtype)
    r, c = values.shape[-2:]
    out = block_dequantize_values(_tiles(values, BLOCK), scales[..., :, None, :, None])
    return _untile(out, r, c).astype(dtype)


def quantize(x: jax.Array, recipe: str, axis: int = -1) -> tuple[jax.Array, jax.Array]:
    """The recipe's activation quantizer along ``axis`` (mxfp8 1 x 32; fp8_block 1 x 128)."""
    check_recipe(recipe)
    if recipe == "mxfp8":
        return quantize_mxfp8(x, axis)
    check_float(x, "quantize")
    axis = check_axis(axis, x.ndim, "quantize")
    values, scales = quantize_fp8_block(jnp.moveaxis(x, axis, -1))
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(scales, -1, axis)


def dequantize(values: jax.Array, scales: jax.Array, recipe: str, axis: int = -1) -> jax.Array:
    """float32 ``deq`` of :func:`quantize`'s ``(values, scales)`` along ``axis``."""
    check_recipe(recipe)
    if recipe == "mxfp8":
        return dequantize_mxfp8(values, scales, axis)
    check_float(values, "dequantize", "values")
    axis = check_axis(axis, values.ndim, "dequantize")
    out = dequantize_fp8_block(jnp.moveaxis(values, axis, -1), jnp.moveaxis(scales, axis, -1))
    return jnp.moveaxis(out, -1, axis)


def fake_quantize(x: jax.Array, recipe: str, axis: int = -1) -> jax.Array:
    """``dequantize(quantize(x))`` along ``axis`` as float32: the activation operand a GEMM of the
    FP8 layer sees."""
    return dequantize(*quantize(x, recipe, axis), recipe, axis)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """A weight stored in FP8 in the layout the kernels read: reduction axis last.

    For a logical weight ``w`` of shape ``shape`` reduced over ``reduction_axis`` (e.g. expert
    weights ``[E, K, N]`` with ``reduction_axis=1``), ``values = moveaxis(Q(w), reduction_axis,
    -1)``: ``[E, N, K]`` ``float8_e4m3fn``. ``scales``: mxfp8 ``[E, N, ceil(K/32)]`` E8M0 (blocks
    of 32 along K); fp8_block ``[E, ceil(N/128), ceil(K/128)]`` float32 (128 x 128 tiles).
    ``recipe`` and ``reduction_axis`` are static pytree metadata. Build with
    :meth:`quantize` (or :func:`jax_mok.quantize_params`); :meth:`dequantize` gives the logical
    layout back. Forward use only: the layer refuses to differentiate through one.
    """

    values: jax.Array
    scales: jax.Array
    recipe: str = dataclasses.field(metadata=dict(static=True))
    reduction_axis: int = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def quantize(cls, w: jax.Array, recipe: str, reduction_axis: int) -> QuantizedWeight:
        """Quantizes ``w`` (>= 2 dims) along ``reduction_axis`` with ``recipe``'s weight format:
        mxfp8 blocks of 32 along it; fp8_block 128 x 128 tiles over the last two axes of the
        stored layout (the reduction axis and the last other axis).
        """
        check_recipe(recipe)
        check_float(w, "QuantizedWeight.quantize", "w")
        if w.ndim < 2:
            raise ValueError(f"QuantizedWeight.quantize: w must have at least 2 dims, got shape "
                             f"{tuple(w.shape)}")
        axis = check_axis(reduction_axis, w.ndim, "QuantizedWeight.quantize")
        stored = jnp.moveaxis(w, axis, -1)
        if recipe == "mxfp8":
            values, scales = quantize_mxfp8(stored, -1)
        else:
            values, scales = quantize_fp8_block(stored, (BLOCK, BLOCK))
        return cls(values, scales, recipe, axis)

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape (the reduction axis back in its place)."""
        shape = list(self.values.shape)
        shape.insert(self.reduction_axis, shape.pop())
        return tuple(shape)

    @property
    def ndim(self) -> int:
        return self.values.ndim

    @property
    def dtype(self):
        return self.values.dtype

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """The weight in its logical layout and ``dtype``."""
        if self.recipe == "mxfp8":
            stored = dequantize_mxfp8(self.values, self.scales, -1, dtype)
        else:
            stored = dequantize_fp8_block(self.values, self.scales, (BLOCK, BLOCK), dtype)
        return jnp.moveaxis(stored, -1, self.reduction_axis)


def scale_count(n: int, recipe: str) -> int:
    """Scales along a blocked axis of length ``n``."""
    return math.ceil(n / (MX_BLOCK if recipe == "mxfp8" else BLOCK))


def check_weights(w_gate_up, w_down, recipe: str | None, shapes: dict | None = None) -> None:
    """Raises ValueError/TypeError unless the expert weights suit ``recipe``: arrays (any
    recipe), or, for a recipe, :class:`QuantizedWeight` s of that recipe in the forward layout
    (``w_gate_up`` along H, ``w_down`` along F, i.e. ``reduction_axis=1``), both or neither."""
    quantized = [isinstance(w, QuantizedWeight) for w in (w_gate_up, w_down)]
    if not any(quantized):
        return
    if recipe is None:
        kind = next(w.recipe for w in (w_gate_up, w_down) if isinstance(w, QuantizedWeight))
        raise ValueError(f"params hold QuantizedWeight experts (recipe {kind!r}) but "
                         f"config.quantization is None; use MoEConfig(quantization={kind!r})")
    if not all(quantized):
        raise TypeError("w_gate_up and w_down must both be QuantizedWeights or both be arrays, "
                        f"got {type(w_gate_up).__name__} and {type(w_down).__name__}")
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if w.recipe != recipe:
            raise ValueError(f"params.{name} is quantized with recipe {w.recipe!r} but "
                             f"config.quantization={recipe!r}")
        if w.reduction_axis != 1 or len(w.shape) != 3:
            raise ValueError(f"params.{name} must be a QuantizedWeight of a [E, K, N] weight "
                             f"along axis 1 (the forward layout, as quantize_params makes), got "
                             f"logical shape {w.shape} along axis {w.reduction_axis}")


def cast_weight(w, dtype):
    """``w.astype(dtype)`` for arrays; QuantizedWeights are used as they are."""
    return w if isinstance(w, QuantizedWeight) else w.astype(dtype)



__all__ = [
    "QuantizedWeight",
    "cast_weight",
    "check_weights",
    "dequantize",
    "dequantize_fp8_block",
    "dequantize_mxfp8",
    "fake_quantize",
    "quantize",
    "quantize_fp8_block",
    "quantize_mxfp8",
    "scale_count",
]
