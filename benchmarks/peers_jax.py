"""The JAX implementations: jax_mok (FFI kernels), B1 (jax_mok.reference, ragged_dot) and
B2 (XLA dense: sort by expert, pad every expert to the max count, batched einsum).

Each is a function ``(x [T, H], ids [T, k], topk_weights [T, k], w_gate_up [E, H, 2F],
w_down [E, F, H]) -> y [T, H]``; :func:`make_step` jits its forward or its forward+backward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax

from jax_mok import reference
from jax_mok.kernels import autodiff

JAX_IMPLS = ("jax_mok", "B1", "B2")


def dense_padded_experts(x: jax.Array, ids: jax.Array, topk_weights: jax.Array,
                         w_gate_up: jax.Array, w_down: jax.Array, *, capacity: int) -> jax.Array:
    """B2: routed experts as two batched einsums over ``[E, capacity, ...]`` padded buffers
    (:func:`jax_mok.reference.routed_experts_padded`). The harness passes the actual maximum
    expert count, computed on the host before jit: a static bound a real model could not know, so
    B2 gets its best case."""
    return reference.routed_experts_padded(x, ids, topk_weights, w_gate_up, w_down, capacity)


def b2_capacity(max_count: int) -> int:
    """B2's padded expert size: the actual max count rounded up to a multiple of 8 (>= 8)."""
    return max(8, -(-max_count // 8) * 8)


def routed_fn(impl: str, *, capacity: int | None = None) -> Callable:
    """The routed-experts function of a JAX implementation name."""
    if impl == "jax_mok":
        return functools.partial(autodiff.routed_experts, implementation="ffi")
    if impl == "B1":
        return functools.partial(autodiff.routed_experts, implementation="reference")
    if impl == "B2":
        if capacity is None:
            raise ValueError("B2 needs capacity (the padded expert size)")
        return functools.partial(dense_padded_experts, capacity=capacity)
    raise ValueError(f"unknown JAX implementation {impl!r}; expected one of {JAX_IMPLS}")


def forward_fn(fn: Callable) -> Callable:
    """jit of ``(x, ids, w, w_gate_up, w_down, dy) -> y``; dy is ignored (uniform signature)."""
    jitted = jax.jit(fn)
    return lambda x, ids, tw, gu, d, dy: jitted(x, ids, tw, gu, d)


def forward_backward_fn(fn: Callable) -> Callable:
    """jit of ``(x, ids, w, w_gate_up, w_down, dy) -> (y, (dx, d_w, d_w_gate_up, d_w_down))``.

    The vjp with the random cotangent ``dy``: the gradients of ``sum(y * dy)`` w.r.t. x, the
    routing weights and both expert weights, and y itself (a training step needs both).
    """

    def step(x, ids, tw, w_gate_up, w_down, dy):
        y, vjp = jax.vjp(lambda x, tw, a, b: fn(x, ids, tw, a, b), x, tw, w_gate_up, w_down)
        return y, vjp(dy)

    return jax.jit(step)
