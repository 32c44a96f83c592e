"""The custom_vjp around the FFI targets ``mok_moe_fwd`` / ``mok_moe_bwd``.

Two residual policies (``save_activations``):
- saved (default on CUDA): the training forward (``mok_moe_fwd_train``) also writes the gate/up
  pre-activations h ``[T*k, 2F]`` in x's dtype, and the backward (``mok_moe_bwd_saved``) reads
  them instead of recomputing the gate/up GEMM (4*T*k*H*F FLOPs, 2/9 of a training step's).
  Costs T*k*2F elements of activation memory per layer (S1: 805 MB in bf16).
- recompute (the CPU backend; ``save_activations=False`` or ``JAX_MOK_SAVE_ACTIVATIONS=0``):
  residuals are the operands only; the backward recomputes h.
Routing ids are integers and get no cotangent; the router's gradient flows through
``topk_weights``. A forward without differentiation always runs the plain ``mok_moe_fwd``.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

from jax_mok import _ffi, reference

IMPLEMENTATIONS = ("reference", "ffi", "cpu", "cuda")


@jax.custom_batching.custom_vmap
def _ffi_forward(x2d, topk_ids, topk_weights, w_gate_up, w_down):
    out = jax.ShapeDtypeStruct(x2d.shape, x2d.dtype)
    return jax.ffi.ffi_call("mok_moe_fwd", out)(x2d, topk_ids, topk_weights, w_gate_up, w_down)


@_ffi_forward.def_vmap
def _ffi_forward_vmap(axis_size, in_batched, x2d, topk_ids, topk_weights, w_gate_up, w_down):
    """vmap over tokens: fold the batch into the token dimension (one kernel call, no loop)."""
    if in_batched[3] or in_batched[4]:
        raise NotImplementedError(
            "jax_mok: vmap over the expert weights (w_gate_up / w_down) is not supported; "
            "only x (and its routing) may be batched"
        )

    def fold(a, batched):
        a = a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))
        return a.reshape(-1, *a.shape[2:])

    rows = x2d.shape[-2]
    y = _ffi_forward(
        fold(x2d, in_batched[0]),
        fold(topk_ids, in_batched[1]),
        fold(topk_weights, in_batched[2]),
        w_gate_up,
        w_down,
    )
    return y.reshape(axis_size, rows, -1), True


@jax.custom_batching.custom_vmap
def _ffi_backward(dy, x2d, topk_ids, topk_weights, w_gate_up, w_down):
    outs = (
        jax.ShapeDtypeStruct(x2d.shape, x2d.dtype),
        jax.ShapeDtypeStruct(topk_weights.shape, topk_weights.dtype),
        jax.ShapeDtypeStruct(w_gate_up.shape, w_gate_up.dtype),
        jax.ShapeDtypeStruct(w_down.shape, w_down.dtype),
    )
    return jax.ffi.ffi_call("mok_moe_bwd", outs)(dy, x2d, topk_ids, topk_weights, w_gate_up, w_down)


@jax.custom_batching.custom_vmap
def _ffi_forward_train(x2d, topk_ids, topk_weights, w_gate_up, w_down):
    tk = topk_ids.shape[0] * topk_ids.shape[1]
    outs = (
        jax.ShapeDtypeStruct(x2d.shape, x2d.dtype),
        jax.ShapeDtypeStruct((tk, w_gate_up.shape[-1]), x2d.dtype),
    )
    return jax.ffi.ffi_call("mok_moe_fwd_train", outs)(
        x2d, topk_ids, topk_weights, w_gate_up, w_down
    )


def _ffi_backward_saved(dy, x2d, topk_ids, topk_weights, w_gate_up, w_down, h):
    outs = (
        jax.ShapeDtypeStruct(x2d.shape, x2d.dtype),
        jax.ShapeDtypeStruct(topk_weights.shape, topk_weights.dtype),
        jax.ShapeDtypeStruct(w_gate_up.shape, w_gate_up.dtype),
        jax.ShapeDtypeStruct(w_down.shape, w_down.dtype),
    )
    return jax.ffi.ffi_call("mok_moe_bwd_saved", outs)(
        dy, x2d, topk_ids, topk_weights, w_gate_up, w_down, h
    )


def _forward_keeping_h(x2d, topk_ids, topk_weights, w_gate_up, w_down):
    """``(y, h)``, chosen per platform at lowering: the saving target exists for CUDA only, so
    elsewhere the plain forward runs and h is a zero placeholder (``_backward_with_h`` then
    recomputes)."""

    def elsewhere(*args):
        tk = topk_ids.shape[0] * topk_ids.shape[1]
        return _ffi_forward(*args), jnp.zeros((tk, w_gate_up.shape[-1]), x2d.dtype)

    return jax.lax.platform_dependent(
        x2d, topk_ids, topk_weights, w_gate_up, w_down, cuda=_ffi_forward_train, default=elsewhere
    )


def _backward_with_h(*args):
    """``mok_moe_bwd_saved`` on CUDA; elsewhere the recomputing backward (h unused)."""
    return jax.lax.platform_dependent(
        *args, cuda=_ffi_backward_saved, default=lambda *a: _ffi_backward(*a[:-1])
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _kernel_experts(x2d, topk_ids, topk_weights, w_gate_up, w_down, save):
    del save  # only the differentiated forward keeps h
    return _ffi_forward(x2d, topk_ids, topk_weights, w_gate_up, w_down)


def _kernel_experts_fwd(x2d, topk_ids, topk_weights, w_gate_up, w_down, save):
    operands = (x2d, topk_ids, topk_weights, w_gate_up, w_down)
    y, h = _forward_keeping_h(*operands) if save else (_ffi_forward(*operands), None)
    return y, (*operands, h)


def _kernel_experts_bwd(save, residuals, dy):
    *operands, h = residuals
    args = (dy.astype(operands[0].dtype), *operands)
    grads = _ffi_backward(*args) if h is None else _backward_with_h(*args, h)
    dx, d_weights, d_gate_up, d_down = grads
    return dx, None, d_weights, d_gate_up, d_down


def _save_activations(implementation: str, save: bool | None) -> bool:
    """The residual policy of a call: explicit, else recompute when
    ``JAX_MOK_SAVE_ACTIVATIONS=0``, else saved where the kernels are CUDA's (``"cuda"``, or
    ``"ffi"`` with a GPU default backend). A computation that lands on the CPU with saving on
    (``"ffi"`` on a GPU machine, CPU devices) recomputes anyway (``_forward_keeping_h``)."""
    if save is None and os.environ.get("JAX_MOK_SAVE_ACTIVATIONS") == "0":
        save = False  # the process-wide switch for measuring the recompute policy
    if save and implementation == "cpu":
        raise ValueError(
            "jax_mok: save_activations=True needs the CUDA kernels, but implementation='cpu'; "
            "the CPU backend recomputes the gate/up GEMM in the backward (pass "
            "save_activations=False or None)"
        )
    if save is None:
        save = implementation == "cuda" or (
            implementation == "ffi" and jax.default_backend() == "gpu"
        )
    return bool(save)


@_ffi_forward_train.def_vmap
@_ffi_backward.def_vmap
def _ffi_backward_vmap(axis_size, in_batched, *args):
    # Per-example weight gradients would need one kernel call per example; say so instead of
    # looping silently.
    raise NotImplementedError(
        "jax_mok: reverse-mode differentiation under jax.vmap is not supported by the kernels. "
        "jax_mok.moe accepts x of any leading shape: fold the vmapped axis into x instead, or "
        "use implementation='reference'"
    )


_kernel_experts.defvjp(_kernel_experts_fwd, _kernel_experts_bwd)


def routed_experts(
    x2d: jax.Array,
    topk_ids: jax.Array,
    topk_weights: jax.Array,
    w_gate_up: jax.Array,
    w_down: jax.Array,
    *,
    implementation: str = "ffi",
    save_activations: bool | None = None,
) -> jax.Array:
    """Routed expert computation after routing: ``y [T, H]`` in x's dtype.

    ``implementation``: ``"reference"`` (pure JAX), ``"ffi"`` (the kernels registered for
    whatever platform the computation lands on), or ``"cpu"`` / ``"cuda"`` (the same targets, with
    a check that that backend is built).
    ``save_activations``: keep the gate/up pre-activations for the backward (T*k*2F elements)
    instead of recomputing them; None = saved on CUDA, recomputed on the CPU (module docstring).
    """
    if implementation == "reference":
        return reference.routed_experts(x2d, topk_ids, topk_weights, w_gate_up, w_down)
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation in ("cpu", "cuda") and not _ffi.kernels_built(implementation):
        raise RuntimeError(
            f"jax_mok: implementation={implementation!r} but its extension _mok_{implementation} "
            "is not built (reinstall jax_mok; the CUDA one needs nvcc on PATH or JAX_MOK_CUDA=1)"
        )
    if implementation == "ffi":
        _ffi.register_targets()
    save = _save_activations(implementation, save_activations)
    return _kernel_experts(x2d, topk_ids, topk_weights, w_gate_up, w_down, save)
