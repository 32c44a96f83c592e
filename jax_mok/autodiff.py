"""The custom_vjp around the FFI targets ``mok_moe_fwd`` / ``mok_moe_bwd``.

Residuals are the operands themselves: the backward recomputes the gate/up GEMM, which costs
4*T*k*H*F FLOPs and saves storing T*k*2F activations. Routing ids are integers and get no
cotangent; the router's gradient flows through ``topk_weights``.
"""

from __future__ import annotations

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
    y = _ffi_forward(fold(x2d, in_batched[0]), fold(topk_ids, in_batched[1]),
                     fold(topk_weights, in_batched[2]), w_gate_up, w_down)
    return y.reshape(axis_size, rows, -1), True


@jax.custom_batching.custom_vmap
def _ffi_backward(dy, x2d, topk_ids, topk_weights, w_gate_up, w_down):
    outs = (
        jax.ShapeDtypeStruct(x2d.shape, x2d.dtype),
        jax.ShapeDtypeStruct(topk_weights.shape, topk_weights.dtype),
        jax.ShapeDtypeStruct(w_gate_up.shape, w_gate_up.dtype),
        jax.ShapeDtypeStruct(w_down.shape, w_down.dtype),
    )
    return jax.ffi.ffi_call("mok_moe_bwd", outs)(
        dy, x2d, topk_ids, topk_weights, w_gate_up, w_down
    )


@jax.custom_vjp
def _kernel_experts(x2d, topk_ids, topk_weights, w_gate_up, w_down):
    return _ffi_forward(x2d, topk_ids, topk_weights, w_gate_up, w_down)


def _kernel_experts_fwd(x2d, topk_ids, topk_weights, w_gate_up, w_down):
    y = _ffi_forward(x2d, topk_ids, topk_weights, w_gate_up, w_down)
    return y, (x2d, topk_ids, topk_weights, w_gate_up, w_down)


def _kernel_experts_bwd(residuals, dy):
    x2d, topk_ids, topk_weights, w_gate_up, w_down = residuals
    dx, d_weights, d_gate_up, d_down = _ffi_backward(
        dy.astype(x2d.dtype), x2d, topk_ids, topk_weights, w_gate_up, w_down
    )
    return dx, None, d_weights, d_gate_up, d_down


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


def routed_experts(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array,
                   w_gate_up: jax.Array, w_down: jax.Array, *,
                   implementation: str = "ffi") -> jax.Array:
    """Routed expert computation after routing: ``y [T, H]`` in x's dtype.

    ``implementation``: ``"reference"`` (pure JAX), ``"ffi"`` (the kernels registered for
    whatever platform the computation lands on), or ``"cpu"`` / ``"cuda"`` (the same targets, with
    a check that that backend is built).
    """
    if implementation == "reference":
        return reference.routed_experts(x2d, topk_ids, topk_weights, w_gate_up, w_down)
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    built = {"cpu": _ffi.cpu_module() is not None, "cuda": _ffi.cuda_module() is not None}
    if implementation in built and not built[implementation]:
        raise RuntimeError(
            f"jax_mok: implementation={implementation!r} but its extension _mok_{implementation} "
            "is not built (reinstall jax_mok; the CUDA one needs nvcc on PATH or JAX_MOK_CUDA=1)"
        )
    return _kernel_experts(x2d, topk_ids, topk_weights, w_gate_up, w_down)
