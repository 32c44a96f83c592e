"""FP8 travel of the EP token rows (``MoEConfig.quantization`` set, either transport): they cross
the expert axis as the recipe's activation operand of the gate/up GEMM, values ``float8_e4m3fn``
and scales (fp8_block: 1 x 128 blocks, float32 scales; mxfp8: 1 x 32 blocks, E8M0 scales;
:func:`jax_mok.quantization.quantize`), about half the bytes of bfloat16 rows.

- :func:`dispatch_rows`: packed ``x`` rows ``[EP, R, H]`` quantized along H, values and scales
  in one uint8 row each (:func:`pack_rows`), all_to_all'd, dequantized to float32 on the
  receiver (:func:`unpack_rows`; the peer transport moves the same bytes: jax_mok.ep.peer).
  Backward: straight through, the cotangent cast to x's dtype and all_to_all'd back (exactly
  the unquantized transpose).
- :func:`return_rows`: the experts' float32 results cast to x's dtype and all_to_all'd home,
  unquantized (the combine, :func:`jax_mok.ep.pack.home_sum`, then adds them in float32).
  Backward: the ``dy`` rows on their way to the expert devices travel quantized along H the
  same way, and arrive as float32 ``deq(Q(dy))``.

Requantization is idempotent in dequantized values: for ``d = deq(Q(t))``, ``deq(Q(d)) == d``
bitwise. fp8_block: the block max quantizes to 448, and ``fl(fl(448 * s) / 448) == s`` for
every ``s = fl(amax / 448)`` (checked exhaustively over float32 mantissas), so the scales and
values come back bitwise. mxfp8: ``d = v * 2**e`` exactly; where the block max ``v`` rounded
down (e.g. to 224 or less), requantization picks a smaller ``e'`` and values ``v * 2**(e - e')``,
which E4M3 holds exactly (no value exceeds 448), so the scales may differ but ``deq`` does not.
(Except where ``d`` is already infinite: mxfp8 rounds ``|t| >= 248 * 2**120`` up to ``2**128``,
for the single-device layer's operand alike.)
tests/test_ep_fp8_rows.py checks both. Hence the FP8 layer that quantizes the received rows
(and the received ``dy``) again sees the same GEMM operands as the single-device layer: the
forward and the data gradients' operands are the single-device ones.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_mok.kernels import vma
from jax_mok.quantization import blocks


def _all_to_all(a: jax.Array, axis: str) -> jax.Array:
    return jax.lax.all_to_all(a, axis, 0, 0, tiled=True)


def packed_width(h: int, recipe: str) -> int:
    """Bytes of one packed row (:func:`pack_rows`): H E4M3 values, the row's scales (fp8_block: a
    float32 per 128 values; mxfp8: an E8M0 byte per 32), zero padding to a multiple of 16 bytes
    (the peer exchange copies 16-byte vectors). 0.52x a bfloat16 row's bytes for H % 512 == 0."""
    blocks.check_recipe(recipe)
    scale_bytes = 4 * -(-h // blocks.BLOCK) if recipe == "fp8_block" else -(-h // blocks.MX_BLOCK)
    return -(-(h + scale_bytes) // 16) * 16


def pack_rows(rows: jax.Array, recipe: str) -> jax.Array:
    """``rows [..., H]`` quantized along H as one uint8 row each, ``[..., packed_width(H)]``:
    values, then the scales' bytes, then zeros. What crosses the expert axis, one array for
    either transport, as bytes: collectives of every backend move uint8 (XLA:CPU widens float8
    collectives to float16, and not every backend's collectives know float8_e8m0fnu)."""
    *lead, h = rows.shape
    values, scales = blocks.quantize(rows, recipe)
    parts = [jax.lax.bitcast_convert_type(values, jnp.uint8),
             jax.lax.bitcast_convert_type(scales, jnp.uint8).reshape(*lead, -1)]
    pad = packed_width(h, recipe) - h - parts[1].shape[-1]
    if pad:
        parts.append(jnp.zeros((*lead, pad), jnp.uint8))
    return jnp.concatenate(parts, axis=-1)


def unpack_rows(packed: jax.Array, recipe: str, h: int) -> jax.Array:
    """float32 ``deq(Q(rows))`` ``[..., H]`` of :func:`pack_rows`'s bytes."""
    *lead, width = packed.shape
    if width != packed_width(h, recipe):
        raise ValueError(f"packed rows of H={h} ({recipe}) are {packed_width(h, recipe)} bytes "
                         f"wide, got {width}")
    values = jax.lax.bitcast_convert_type(packed[..., :h], jnp.float8_e4m3fn)
    if recipe == "fp8_block":
        n = -(-h // blocks.BLOCK)
        raw = packed[..., h:h + 4 * n].reshape(*lead, n, 4)
        scales = jax.lax.bitcast_convert_type(raw, jnp.float32)
    else:
        n = -(-h // blocks.MX_BLOCK)
        scales = jax.lax.bitcast_convert_type(packed[..., h:h + n], jnp.float8_e8m0fnu)
    return blocks.dequantize(values, scales, recipe)


def travel_quantized(rows: jax.Array, axis: str, recipe: str) -> jax.Array:
    """``rows [EP, R, H]`` quantized along H, packed (values and scales in one uint8 row each)
    and all_to_all'd over ``axis``, dequantized: float32 ``[EP, R, H]``, the received
    ``deq(Q(rows))``."""
    return unpack_rows(_all_to_all(pack_rows(rows, recipe), axis), recipe, rows.shape[-1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def dispatch_rows(rows: jax.Array, axis: str, recipe: str) -> jax.Array:
    """The packed rows ``[EP, R, H]`` (x's dtype) at their experts' devices as float32
    ``deq(Q(rows))`` (module docstring); the gradient is straight through."""
    return travel_quantized(rows, axis, recipe)


def _dispatch_fwd(rows, axis, recipe):
    # A zero-size slice carries the rows' dtype and (inside shard_map) their vma type.
    return travel_quantized(rows, axis, recipe), rows.reshape(-1)[:0]


def _dispatch_bwd(axis, recipe, like, ct):
    del recipe
    back = _all_to_all(ct.astype(like.dtype), axis)
    return (vma.cotangent_like(back, like),)


dispatch_rows.defvjp(_dispatch_fwd, _dispatch_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def return_rows(out: jax.Array, axis: str, recipe: str, dtype) -> jax.Array:
    """The experts' results ``out [EP, R, H]`` float32, home in ``dtype`` (x's); the cotangent
    travels quantized (module docstring)."""
    del recipe
    return _all_to_all(out.astype(dtype), axis)


def _return_fwd(out, axis, recipe, dtype):
    del recipe
    return _all_to_all(out.astype(dtype), axis), out.reshape(-1)[:0]


def _return_bwd(axis, recipe, dtype, like, ct):
    del dtype
    dy = travel_quantized(ct, axis, recipe).astype(like.dtype)
    return (vma.cotangent_like(dy, like),)


return_rows.defvjp(_return_fwd, _return_bwd)


__all__ = ["dispatch_rows", "pack_rows", "packed_width", "return_rows", "travel_quantized",
           "unpack_rows"]
