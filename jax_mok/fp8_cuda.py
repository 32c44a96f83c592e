"""The FP8 layer on the CUDA kernels: ``mok_moe_fwd_fp8`` / ``mok_moe_bwd_fp8`` in a custom_vjp.

The same semantics as :mod:`jax_mok.fp8` (the pure-JAX definition and the CPU path): x, dy and the
weights are quantized here by jax_mok.quantization (XLA fusions: the format is defined once), with
each GEMM's reduction axis last, as FP8 wgmma reads its operands; the kernels quantize what they
produce themselves (the SwiGLU output along F in the gate/up epilogue, dh along 2F, and the weight
gradients' operands along each expert's tokens) with the same rules.

Residual policy as the BF16 layer: with ``save`` the forward also writes h [T*k, 2F] in x's dtype
and the backward skips its gate/up GEMM; without it the backward recomputes h from the quantized
x and w_gate_up.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_mok import quantization

RECIPE_CODES = {"mxfp8": 1, "fp8_block": 2}


def quantize_rows(x: jax.Array, recipe: str) -> tuple[jax.Array, jax.Array]:
    """``x [R, C]`` quantized along C: values ``[R, C]`` e4m3 and the recipe's scales."""
    if recipe == "mxfp8":
        return quantization.quantize_mxfp8(x, axis=-1)
    return quantization.quantize_fp8_block(x, block=(1, 128))


def weight_k_major(w: jax.Array, reduce_axis: int, recipe: str) -> tuple[jax.Array, jax.Array]:
    """Expert weights ``w [E, A, B]`` quantized along ``reduce_axis`` (1 or 2) and laid out with
    that axis last (the kernels' K-major operand): values ``[E, N, K]`` and scales ``[E, N, K/32]``
    (mxfp8) or ``[E, N/128, K/128]`` (fp8_block: 128 x 128 blocks, which do not depend on the
    reduction axis, so the forward and backward operands share their values)."""
    if recipe == "mxfp8":
        values, scales = quantization.quantize_mxfp8(w, axis=reduce_axis)
    else:
        values, scales = quantization.quantize_fp8_block(w, block=(128, 128))
    if reduce_axis == 1:
        values, scales = jnp.swapaxes(values, 1, 2), jnp.swapaxes(scales, 1, 2)
    return values, scales


def _forward_weights(w_gate_up, w_down, recipe):
    """The forward's K-major operands: w_gate_up along H -> [E, 2F, H], w_down along F ->
    [E, H, F]; pre-quantized weights (jax_mok.quantization.QuantizedWeight) are used as stored."""
    out = []
    for w in (w_gate_up, w_down):
        if isinstance(w, quantization.QuantizedWeight):
            out.append((w.values, w.scales))
        else:
            out.append(weight_k_major(w, 1, recipe))
    return tuple(out)


def _forward_call(xq, ids, weights, wgu, wd, recipe: str, dtype, save: bool):
    T, H = xq[0].shape
    F = wd[0].shape[-1]
    y = jax.ShapeDtypeStruct((T, H), dtype)
    operands = (*xq, ids, weights, *wgu, *wd)
    code = np.int32(RECIPE_CODES[recipe])
    if save:
        h = jax.ShapeDtypeStruct((T * ids.shape[1], 2 * F), dtype)
        return jax.ffi.ffi_call("mok_moe_fwd_train_fp8", (y, h))(*operands, recipe=code)
    return jax.ffi.ffi_call("mok_moe_fwd_fp8", y)(*operands, recipe=code), None


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def routed_experts_fp8_cuda(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array,
                            w_gate_up, w_down, recipe: str, save: bool) -> jax.Array:
    """``y [T, H]`` in x's dtype: the FP8 routed experts on the CUDA kernels.

    ``x2d [T, H]`` bf16/f32, ``topk_ids [T, k]`` int32, ``topk_weights [T, k]`` f32, ``w_gate_up
    [E, H, 2F]`` and ``w_down [E, F, H]`` (arrays, or QuantizedWeights for inference).
    """
    del save
    wgu, wd = _forward_weights(w_gate_up, w_down, recipe)
    y, _ = _forward_call(quantize_rows(x2d, recipe), topk_ids, topk_weights, wgu, wd, recipe,
                         x2d.dtype, False)
    return y


def _fwd(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe, save):
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if isinstance(w, quantization.QuantizedWeight):
            raise TypeError(
                f"jax_mok: {name} is pre-quantized (jax_mok.quantize_params), which serves "
                "inference only; differentiate with the unquantized MoEParams instead")
    xq = quantize_rows(x2d, recipe)
    wgu, wd = _forward_weights(w_gate_up, w_down, recipe)
    y, h = _forward_call(xq, topk_ids, topk_weights, wgu, wd, recipe, x2d.dtype, save)
    return y, (x2d, xq, topk_ids, topk_weights, w_gate_up, w_down, wgu, h)


def _bwd(recipe, save, residuals, dy):
    x2d, xq, topk_ids, topk_weights, w_gate_up, w_down, wgu_fwd, h = residuals
    dtype = x2d.dtype
    dy = dy.astype(dtype)
    dyq = quantize_rows(dy, recipe)
    wd_b = weight_k_major(w_down, 2, recipe)      # [E, F, H], along H
    wgu_b = weight_k_major(w_gate_up, 2, recipe)  # [E, H, 2F], along 2F
    E, H, two_f = w_gate_up.shape
    T, k = topk_ids.shape
    outs = (jax.ShapeDtypeStruct((T, H), dtype), jax.ShapeDtypeStruct((T, k), jnp.float32),
            jax.ShapeDtypeStruct((E, H, two_f), dtype),
            jax.ShapeDtypeStruct((E, two_f // 2, H), dtype))
    operands = [dy, *dyq, x2d, *xq, topk_ids, topk_weights, *wgu_fwd, *wd_b, *wgu_b]
    code = np.int32(RECIPE_CODES[recipe])
    if h is not None:
        grads = jax.ffi.ffi_call("mok_moe_bwd_saved_fp8", outs)(*operands, h, recipe=code)
    else:
        grads = jax.ffi.ffi_call("mok_moe_bwd_fp8", outs)(*operands, recipe=code)
    dx, d_w, d_gu, d_dn = grads
    return (dx, None, d_w, d_gu.astype(w_gate_up.dtype), d_dn.astype(w_down.dtype))


routed_experts_fp8_cuda.defvjp(_fwd, _bwd)


def quantize_on_device(x: jax.Array, recipe: str) -> tuple[jax.Array, jax.Array]:
    """``mok_quantize``: the CUDA kernels' own row quantizer on ``x [R, C]`` (C a multiple of
    128), for the tests that compare its bits with jax_mok.quantization."""
    R, C = x.shape
    if recipe == "mxfp8":
        scales = jax.ShapeDtypeStruct((R, C // 32), jnp.float8_e8m0fnu)
    else:
        scales = jax.ShapeDtypeStruct((R, C // 128), jnp.float32)
    values = jax.ShapeDtypeStruct((R, C), jnp.float8_e4m3fn)
    return jax.ffi.ffi_call("mok_quantize", (values, scales))(
        x, recipe=np.int32(RECIPE_CODES[recipe]))
