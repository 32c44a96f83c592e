"""The FP8 layer (``MoEConfig(quantization=...)``) on the kernels: which implementation runs a
call, and the custom_vjps over the CUDA FP8 targets.

The semantics are :mod:`jax_mok.quantization.layer`'s (pure JAX: the CPU path and the oracle).
On CUDA the kernels compute the same function up to float32 summation order, and no operand is
quantized by XLA: x and dy by ``mok_quantize`` (rows along H), the expert weights by
``mok_quantize_weight`` (one pass per weight; a differentiated forward writes the backward's
layouts in the same pass and keeps them for the backward), each with the bits of
:mod:`jax_mok.quantization.blocks` (the GPU tests compare them) and laid out with its GEMM's
reduction axis last, as FP8 wgmma reads it. The kernels quantize what they produce themselves
(a = SwiGLU(h) along F in the gate/up epilogue, dh along 2F, and the weight gradients' operands
along each expert's tokens) with the same rules (ffi/cuda/device/fp8_format.cuh).

mxfp8 with bf16 x and unquantized weight gradients runs through the BF16 GEMMs instead
(:func:`routed_experts_mx_bf16_cuda`, the block comment above it): its operands are dequantized
exactly by ``mok_mx_qdq`` and the BF16 kernels read them.

Prepared weights (:func:`jax_mok.fp8_weights`, an ``Fp8Weights`` of QuantizedWeights) replace
the weight quantization of a call: the call reads their layouts, and its gradients with respect
to the array weights are those of the plain call (the array weights are the differentiated
inputs; the prepared ones are not).

Residuals: with ``save`` the forward also writes h [T*k, 2F] in x's dtype and the backward skips
its gate/up GEMM; without it the backward recomputes h (the same bits).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_mok.kernels import _ffi, targets
from jax_mok.kernels.autodiff import check_implementation, resolve_save_activations
from jax_mok.quantization import layer
from jax_mok.quantization.blocks import QuantizedWeight
from jax_mok.tuning import KernelTuning
from jax_mok.warn import warn_once


def _forward_weights(w_gate_up, w_down, recipe: str):
    """w_gate_up along H -> [E, 2F, H], w_down along F -> [E, H, F] (``mok_quantize_weight``);
    QuantizedWeights (which store exactly this layout) as they are."""
    return tuple((w.values, w.scales) if isinstance(w, QuantizedWeight)
                 else targets.quantize_weight(w, recipe, 1) for w in (w_gate_up, w_down))


def _pair(w: QuantizedWeight) -> tuple[jax.Array, jax.Array]:
    return w.values, w.scales


def _check_trainable(w_gate_up, w_down):
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if isinstance(w, QuantizedWeight):
            raise TypeError(
                f"jax_mok: {name} is pre-quantized (jax_mok.quantize_params), which serves "
                "inference only; differentiate with the unquantized MoEParams instead")


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def routed_experts_fp8_cuda(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array,
                            w_gate_up, w_down, recipe: str, save: bool,
                            weight_grads: str = "fp8") -> jax.Array:
    """``y [T, H]`` in x's dtype on the CUDA FP8 kernels. ``x2d [T, H]`` bf16/f32, ``topk_ids
    [T, k]`` int32, ``topk_weights [T, k]`` f32, ``w_gate_up [E, H, 2F]``, ``w_down [E, F, H]``
    (arrays in x's dtype, or QuantizedWeights for inference)."""
    del save  # only a differentiated forward keeps h
    wgu, wd = _forward_weights(w_gate_up, w_down, recipe)
    y, _ = targets.fp8_forward(targets.quantize_rows(x2d, recipe), topk_ids, topk_weights, wgu,
                               wd, recipe, x2d.dtype, False)
    return y


def _cuda_fwd(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe, save, weight_grads):
    del weight_grads
    _check_trainable(w_gate_up, w_down)
    x_q = targets.quantize_rows(x2d, recipe)
    # One pass per weight writes the forward's layout and the backward's, kept as residuals:
    # 2 bytes per weight less traffic than quantizing again in the backward.
    wgu, wgu_t = targets.quantize_weight_both(w_gate_up, recipe)  # [E,2F,H] / [E,H,2F]
    wd, wd_t = targets.quantize_weight_both(w_down, recipe)  # [E,H,F] / [E,F,H]
    y, h = targets.fp8_forward(x_q, topk_ids, topk_weights, wgu, wd, recipe, x2d.dtype, save)
    # The forward's gate/up layout is a residual only for recomputing h (S4: 16 GB less held).
    return y, (x2d, x_q, topk_ids, topk_weights, None if save else wgu, wd_t, wgu_t, h)


def _backward(recipe, weight_grads, residuals, dy):
    x2d, x_q, topk_ids, topk_weights, wgu, wd_t, wgu_t, h = residuals
    dy = dy.astype(x2d.dtype)
    dx, d_w, d_gu, d_dn = targets.fp8_backward(
        dy, targets.quantize_rows(dy, recipe), x2d, x_q, topk_ids, topk_weights, wgu, wd_t,
        wgu_t, h, recipe, weight_grads)
    return dx, d_w, d_gu, d_dn


def _cuda_bwd(recipe, save, weight_grads, residuals, dy):
    del save
    dx, d_w, d_gu, d_dn = _backward(recipe, weight_grads, residuals, dy)
    return dx, None, d_w, d_gu, d_dn


routed_experts_fp8_cuda.defvjp(_cuda_fwd, _cuda_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def routed_experts_fp8_prepared_cuda(x2d, topk_ids, topk_weights, w_gate_up, w_down, prepared,
                                     recipe: str, save: bool,
                                     weight_grads: str = "fp8") -> jax.Array:
    """:func:`routed_experts_fp8_cuda` reading ``prepared`` (an ``Fp8Weights``) instead of
    quantizing ``w_gate_up`` / ``w_down``, which are only the differentiated inputs: their
    cotangents are the layer's weight gradients; ``prepared`` gets none."""
    del w_gate_up, w_down, save, weight_grads
    y, _ = targets.fp8_forward(targets.quantize_rows(x2d, recipe), topk_ids, topk_weights,
                               _pair(prepared.gate_up), _pair(prepared.down), recipe, x2d.dtype,
                               False)
    return y


def _prepared_fwd(x2d, topk_ids, topk_weights, w_gate_up, w_down, prepared, recipe, save,
                  weight_grads):
    del w_gate_up, w_down, weight_grads
    prepared.require_backward()
    x_q = targets.quantize_rows(x2d, recipe)
    wgu = _pair(prepared.gate_up)
    y, h = targets.fp8_forward(x_q, topk_ids, topk_weights, wgu, _pair(prepared.down), recipe,
                               x2d.dtype, save)
    return y, (x2d, x_q, topk_ids, topk_weights, None if save else wgu, _pair(prepared.down_t),
               _pair(prepared.gate_up_t), h)


def _prepared_bwd(recipe, save, weight_grads, residuals, dy):
    del save
    dx, d_w, d_gu, d_dn = _backward(recipe, weight_grads, residuals, dy)
    return dx, None, d_w, d_gu, d_dn, None


routed_experts_fp8_prepared_cuda.defvjp(_prepared_fwd, _prepared_bwd)


# --- mxfp8 through the BF16 GEMMs ----------------------------------------------------------
# Hopper's FP8 wgmma has no block scales: mxfp8's GEMMs promote every 32 products to float32 on
# the CUDA cores, which costs more issue slots than the tensor time it saves (docs/fp8.md). Here
# the BF16 kernels run on the mxfp8 operands dequantized exactly instead: an E4M3 value times 2^e
# has at most 4 significant bits, a bf16 value whenever e >= -124 (below that the bf16 rounding of
# values under 2^-133 is the only difference from the float32 oracle). x, dy and the weights pass
# through ``mok_mx_qdq`` (deq(Q(.)) in one pass, in place of their layouts); a = SwiGLU(h) is
# quantized from its float32 value in the gate/up epilogue (kSwiGLUMx) and dh by a pass before
# dh·Wguᵀ, as the layer's semantics say. The weight gradients are the BF16 backward's:
# weight_grads="unquantized" only. The forward always keeps h, whatever save_activations says:
# a recompute would need x's and the weights' forward operands kept instead, weight-sized.
_MX = "mxfp8"
_MX_KERNEL = KernelTuning()


@jax.custom_vjp
def routed_experts_mx_bf16_cuda(x2d, topk_ids, topk_weights, w_gate_up, w_down):
    """The mxfp8 layer on the BF16 kernels (block comment above): ``y [T, H]`` bf16 from bf16
    ``x2d`` and array weights (pre-quantized ones take the FP8 kernels), the values of
    :func:`jax_mok.quantization.layer.routed_experts_fp8` with ``recipe="mxfp8"``,
    ``weight_grads="unquantized"`` up to float32 summation order."""
    y, _ = targets.mx_forward(_MX_KERNEL, targets.mx_qdq(x2d, 1), topk_ids, topk_weights,
                              targets.mx_qdq(w_gate_up, 1), targets.mx_qdq(w_down, 1), False)
    return y


def _mx_fwd(x2d, topk_ids, topk_weights, w_gate_up, w_down):
    y, h = targets.mx_forward(_MX_KERNEL, targets.mx_qdq(x2d, 1), topk_ids, topk_weights,
                              targets.mx_qdq(w_gate_up, 1), targets.mx_qdq(w_down, 1), True)
    # The backward makes its layouts from the weights (alive anyway), one at a time in its
    # scratch: no residual copy, one weight-sized layout held at once.
    return y, (x2d, topk_ids, topk_weights, w_gate_up, w_down, h)


def _mx_backward(qdq_weights, x2d, topk_ids, topk_weights, wgu_t, wd_t, h, dy):
    dy = dy.astype(x2d.dtype)
    return targets.mx_backward_saved(_MX_KERNEL, targets.mx_qdq(dy, 1), dy, x2d, topk_ids,
                                     topk_weights, wgu_t, wd_t, h, qdq_weights)


def _mx_bwd(residuals, dy):
    dx, d_w, d_gu, d_dn = _mx_backward(True, *residuals, dy)  # the weights: layouts made there
    return dx, None, d_w, d_gu, d_dn


routed_experts_mx_bf16_cuda.defvjp(_mx_fwd, _mx_bwd)


@jax.custom_vjp
def routed_experts_mx_bf16_prepared_cuda(x2d, topk_ids, topk_weights, w_gate_up, w_down,
                                         prepared):
    """:func:`routed_experts_mx_bf16_cuda` reading ``prepared`` (an ``Fp8Weights`` of
    ``form="bf16"``) instead of quantizing the weights; ``w_gate_up`` / ``w_down`` only receive
    the gradients."""
    del w_gate_up, w_down
    y, _ = targets.mx_forward(_MX_KERNEL, targets.mx_qdq(x2d, 1), topk_ids, topk_weights,
                              prepared.gate_up, prepared.down, False)
    return y


def _mx_prepared_fwd(x2d, topk_ids, topk_weights, w_gate_up, w_down, prepared):
    del w_gate_up, w_down
    prepared.require_backward()
    y, h = targets.mx_forward(_MX_KERNEL, targets.mx_qdq(x2d, 1), topk_ids, topk_weights,
                              prepared.gate_up, prepared.down, True)
    return y, (x2d, topk_ids, topk_weights, prepared.gate_up_t, prepared.down_t, h)


def _mx_prepared_bwd(residuals, dy):
    dx, d_w, d_gu, d_dn = _mx_backward(False, *residuals, dy)  # the prepared layouts
    return dx, None, d_w, d_gu, d_dn, None


routed_experts_mx_bf16_prepared_cuda.defvjp(_mx_prepared_fwd, _mx_prepared_bwd)


def mx_bf16_limits(x_dtype, weight_grads: str) -> str | None:
    """None when :func:`routed_experts_mx_bf16_cuda` runs a call (beyond :func:`cuda_limits`),
    else why not."""
    if jnp.dtype(x_dtype) != jnp.bfloat16:
        return f"mxfp8 through the BF16 GEMMs needs bfloat16 x, got {jnp.dtype(x_dtype)}"
    if weight_grads != "unquantized":
        return ("mxfp8 through the BF16 GEMMs computes the weight gradients in bf16 "
                "(fp8_weight_gradients='unquantized'), not " + repr(weight_grads))
    module = _ffi.cuda_module()
    if module is not None and not module.device_info().get("wgmma_path", False):
        return "mxfp8 through the BF16 GEMMs needs the wgmma kernels (a build with CUTLASS)"
    return None


# Experts per call of the FP8 kernels (ffi/cuda/phases/fp8.h: kFp8MaxExperts).
MAX_EXPERTS = 1024


def cuda_limits(hidden: int, ffn: int, experts: int = 1) -> str | None:
    """None when the CUDA FP8 kernels run a layer of this size on this GPU, else why not."""
    if not _ffi.kernels_built("cuda"):
        return "the CUDA extension is not built"
    if (device := _ffi.cuda_device_limits()) is not None:
        return device
    if hidden % 128 or ffn % 128:
        return (f"the FP8 kernels need hidden_size and ffn_size multiples of 128, got {hidden}, "
                f"{ffn}")
    if experts > MAX_EXPERTS:
        return f"the FP8 kernels take at most {MAX_EXPERTS} experts per call, got {experts}"
    return None


def routed_experts_fp8(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array, w_gate_up,
                       w_down, recipe: str, *, implementation: str = "ffi",
                       save_activations: bool | None = None, prepared=None,
                       weight_grads: str = "fp8") -> jax.Array:
    """The FP8 routed experts: the CUDA kernels for ``implementation="cuda"``, or ``"ffi"`` with
    a GPU default backend, where :func:`cuda_limits` allows (a one-time warning says why not,
    and the pure-JAX layer runs); :func:`jax_mok.quantization.layer.routed_experts_fp8` everywhere
    else. ``prepared``: the expert weights' FP8 layouts (``jax_mok.fp8_weights``), read instead
    of quantizing ``w_gate_up`` / ``w_down``. ``weight_grads``: ``"fp8"`` or ``"unquantized"``
    (``MoEConfig.fp8_weight_gradients``). mxfp8 runs through the BF16 GEMMs
    (:func:`routed_experts_mx_bf16_cuda`) wherever :func:`mx_bf16_limits` allows (bf16 x,
    unquantized weight gradients), else on the FP8 kernels with the per-32 promotion."""
    check_implementation(implementation)
    layer.check_weight_grads(weight_grads)
    on_gpu = implementation == "cuda" or (
        implementation == "ffi" and jax.default_backend() == "gpu")
    if on_gpu:
        reason = cuda_limits(x2d.shape[-1], w_down.shape[-2], w_down.shape[0])
        # Pre-quantized weights (quantize_params, inference) stay on the FP8 kernels, which read
        # their E4M3 bytes as they are (dequantizing them would cost a weight-sized pass a call).
        bf16_path = (reason is None and recipe == _MX and not isinstance(w_gate_up, QuantizedWeight)
                     and mx_bf16_limits(x2d.dtype, weight_grads) is None)
        form = "fp8" if prepared is None else prepared.form
        # (Where the pure-JAX layer runs instead, it reads either form.)
        if reason is None and prepared is not None and form != ("bf16" if bf16_path else "fp8"):
            raise TypeError(
                f"jax_mok: these fp8_weights hold the {form!r} layouts, but this call runs "
                + ("mxfp8 through the BF16 GEMMs, which read the bf16 ones: make them with "
                   "jax_mok.fp8_weights(params, dtype=jnp.bfloat16) on the GPU"
                   if bf16_path else "the FP8 kernels, which read the FP8 ones: make them with "
                   "jax_mok.fp8_weights(params, implementation='reference')"))
        if bf16_path:
            if prepared is not None:
                return routed_experts_mx_bf16_prepared_cuda(x2d, topk_ids, topk_weights,
                                                            w_gate_up, w_down, prepared)
            return routed_experts_mx_bf16_cuda(x2d, topk_ids, topk_weights, w_gate_up, w_down)
        if reason is None:
            save = resolve_save_activations(implementation, save_activations)
            if prepared is not None:
                return routed_experts_fp8_prepared_cuda(x2d, topk_ids, topk_weights, w_gate_up,
                                                        w_down, prepared, recipe, save,
                                                        weight_grads)
            return routed_experts_fp8_cuda(x2d, topk_ids, topk_weights, w_gate_up, w_down,
                                           recipe, save, weight_grads)
        warn_once(("fp8", reason), f"jax_mok: quantization={recipe!r} runs the pure-JAX FP8 "
                  f"layer because {reason}", stacklevel=3)
    return layer.routed_experts_fp8(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe,
                                    prepared=prepared, weight_grads=weight_grads)


__all__ = ["MAX_EXPERTS", "cuda_limits", "mx_bf16_limits", "routed_experts_fp8",
           "routed_experts_fp8_cuda", "routed_experts_fp8_prepared_cuda",
           "routed_experts_mx_bf16_cuda", "routed_experts_mx_bf16_prepared_cuda"]
