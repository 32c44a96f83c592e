"""The FP8 layer (``MoEConfig(quantization=...)``) on the kernels: which implementation runs a
call, and the custom_vjp over the CUDA FP8 targets.

The semantics are :mod:`jax_mok.quantization.layer`'s (pure JAX: the CPU path and the oracle).
On CUDA the kernels compute the same function up to float32 summation order: x, dy and the
weights are quantized here by :mod:`jax_mok.quantization.blocks` (XLA fusions: the format is
defined once), each operand laid out with its GEMM's reduction axis last, as FP8 wgmma reads it;
the kernels quantize what they produce themselves (a = SwiGLU(h) along F in the gate/up
epilogue, dh along 2F, and the weight gradients' operands along each expert's tokens) with the
same rules (ffi/cuda/device/fp8_format.cuh).

Residuals: with ``save`` the forward also writes h [T*k, 2F] in x's dtype and the backward skips
its gate/up GEMM; without it the backward recomputes h (the same bits).
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp

from jax_mok.kernels import _ffi, targets
from jax_mok.kernels.autodiff import check_implementation, resolve_save_activations
from jax_mok.quantization import blocks, layer
from jax_mok.quantization.blocks import QuantizedWeight

_warned: set[str] = set()


def weight_k_major(w: jax.Array, reduce_axis: int, recipe: str) -> tuple[jax.Array, jax.Array]:
    """Expert weights ``w [E, A, B]`` quantized along ``reduce_axis`` (1 or 2), laid out with
    that axis last: values ``[E, N, K]``, scales ``[E, N, K/32]`` (mxfp8) or ``[E, N/128, K/128]``
    (fp8_block: 128 x 128 tiles, the same whichever axis is reduced)."""
    if recipe == "mxfp8":
        values, scales = blocks.quantize_mxfp8(w, axis=reduce_axis)
    else:
        values, scales = blocks.quantize_fp8_block(w, block=(128, 128))
    if reduce_axis == 1:
        values, scales = jnp.swapaxes(values, 1, 2), jnp.swapaxes(scales, 1, 2)
    return values, scales


def _forward_weights(w_gate_up, w_down, recipe: str):
    """w_gate_up along H -> [E, 2F, H], w_down along F -> [E, H, F]; QuantizedWeights (which
    store exactly this layout) as they are."""
    return tuple((w.values, w.scales) if isinstance(w, QuantizedWeight)
                 else weight_k_major(w, 1, recipe) for w in (w_gate_up, w_down))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def routed_experts_fp8_cuda(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array,
                            w_gate_up, w_down, recipe: str, save: bool) -> jax.Array:
    """``y [T, H]`` in x's dtype on the CUDA FP8 kernels. ``x2d [T, H]`` bf16/f32, ``topk_ids
    [T, k]`` int32, ``topk_weights [T, k]`` f32, ``w_gate_up [E, H, 2F]``, ``w_down [E, F, H]``
    (arrays in x's dtype, or QuantizedWeights for inference)."""
    del save  # only a differentiated forward keeps h
    wgu, wd = _forward_weights(w_gate_up, w_down, recipe)
    y, _ = targets.fp8_forward(blocks.quantize(x2d, recipe), topk_ids, topk_weights, wgu, wd,
                               recipe, x2d.dtype, False)
    return y


def _cuda_fwd(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe, save):
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if isinstance(w, QuantizedWeight):
            raise TypeError(
                f"jax_mok: {name} is pre-quantized (jax_mok.quantize_params), which serves "
                "inference only; differentiate with the unquantized MoEParams instead")
    x_q = blocks.quantize(x2d, recipe)
    wgu, wd = _forward_weights(w_gate_up, w_down, recipe)
    y, h = targets.fp8_forward(x_q, topk_ids, topk_weights, wgu, wd, recipe, x2d.dtype, save)
    return y, (x2d, x_q, topk_ids, topk_weights, w_gate_up, w_down, wgu, h)


def _cuda_bwd(recipe, save, residuals, dy):
    del save
    x2d, x_q, topk_ids, topk_weights, w_gate_up, w_down, wgu_fwd, h = residuals
    dy = dy.astype(x2d.dtype)
    dx, d_w, d_gu, d_dn = targets.fp8_backward(
        dy, blocks.quantize(dy, recipe), x2d, x_q, topk_ids, topk_weights, wgu_fwd,
        weight_k_major(w_down, 2, recipe), weight_k_major(w_gate_up, 2, recipe), h, recipe)
    return dx, None, d_w, d_gu.astype(w_gate_up.dtype), d_dn.astype(w_down.dtype)


routed_experts_fp8_cuda.defvjp(_cuda_fwd, _cuda_bwd)


def cuda_limits(hidden: int, ffn: int) -> str | None:
    """None when the CUDA FP8 kernels run a layer of this width on this GPU, else why not."""
    if not _ffi.kernels_built("cuda"):
        return "the CUDA extension is not built"
    if (device := _ffi.cuda_device_limits()) is not None:
        return device
    if hidden % 128 or ffn % 128:
        return (f"the FP8 kernels need hidden_size and ffn_size multiples of 128, got {hidden}, "
                f"{ffn}")
    return None


def routed_experts_fp8(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array, w_gate_up,
                       w_down, recipe: str, *, implementation: str = "ffi",
                       save_activations: bool | None = None) -> jax.Array:
    """The FP8 routed experts: the CUDA kernels for ``implementation="cuda"``, or ``"ffi"`` with
    a GPU default backend, where :func:`cuda_limits` allows (a one-time warning says why not,
    and the pure-JAX layer runs); :func:`jax_mok.quantization.layer.routed_experts_fp8` everywhere
    else."""
    check_implementation(implementation)
    on_gpu = implementation == "cuda" or (
        implementation == "ffi" and jax.default_backend() == "gpu")
    if on_gpu:
        reason = cuda_limits(x2d.shape[-1], w_down.shape[-2])
        if reason is None:
            save = resolve_save_activations(implementation, save_activations)
            return routed_experts_fp8_cuda(x2d, topk_ids, topk_weights, w_gate_up, w_down,
                                           recipe, save)
        if reason not in _warned:
            _warned.add(reason)
            warnings.warn(f"jax_mok: quantization={recipe!r} runs the pure-JAX FP8 layer because "
                          f"{reason}", stacklevel=3)
    return layer.routed_experts_fp8(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe)


__all__ = ["cuda_limits", "routed_experts_fp8", "routed_experts_fp8_cuda",
           "weight_k_major"]
