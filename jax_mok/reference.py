"""The pure-JAX oracle: the same MoE layer with sort-based dispatch and ``lax.ragged_dot``.

This is what a JAX user writes today; it is differentiable by autodiff and serves as the oracle
for every kernel test. It also is the portable fallback where no kernel is built.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mok.routing import DROPPED


def routed_experts(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array,
                   w_gate_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """``y [T, H] = sum_j w[t, j] * SwiGLU_{ids[t, j]}(x_t)`` in float32, cast to x's dtype.

    ``x2d [T, H]``, ``topk_ids [T, k]`` int32 (ids outside ``[0, E)`` are skipped),
    ``topk_weights [T, k]`` float32, ``w_gate_up [E, H, 2F]``, ``w_down [E, F, H]``. GEMM operands
    keep x's dtype with float32 accumulation (the activation is rounded to x's dtype before the
    down GEMM, as the kernels do).
    """
    T, k = topk_ids.shape
    E, _, two_f = w_gate_up.shape
    F = two_f // 2
    flat_ids = topk_ids.reshape(-1)
    valid = (flat_ids >= 0) & (flat_ids < E)
    sort_key = jnp.where(valid, flat_ids, E)  # skipped assignments sort last, past every group
    order = jnp.argsort(sort_key, stable=True)
    group_sizes = jnp.bincount(sort_key, length=E + 1)[:E].astype(jnp.int32)
    rows = x2d[order // k]  # [T*k, H]
    h = jax.lax.ragged_dot(rows, w_gate_up, group_sizes, preferred_element_type=jnp.float32)
    a = jax.nn.silu(h[:, :F]) * h[:, F:]  # [T*k, F] f32
    out = jax.lax.ragged_dot(a.astype(x2d.dtype), w_down, group_sizes,
                             preferred_element_type=jnp.float32)  # [T*k, H]
    weights = jnp.where(valid, topk_weights.reshape(-1), 0.0)[order]
    contrib = out * weights[:, None]
    unsorted = jnp.zeros_like(contrib).at[order].set(contrib)
    return unsorted.reshape(T, k, -1).sum(1).astype(x2d.dtype)


def routed_experts_padded(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array,
                          w_gate_up: jax.Array, w_down: jax.Array, capacity: int) -> jax.Array:
    """The same function as :func:`routed_experts` through a padded batched einsum.

    Every expert gets ``capacity`` row slots (a static int that must be >= the largest expert
    count, e.g. measured on the host); the work is ``E * capacity`` rows instead of ``T * k``.
    XLA:CPU runs ``ragged_dot`` as one dense product per group (cost linear in E), so this form is
    the fast oracle for large E on the CPU. Rows past an expert's count are zero and masked.
    """
    T, k = topk_ids.shape
    E, _, two_f = w_gate_up.shape
    F = two_f // 2
    flat_ids = topk_ids.reshape(-1)
    valid = (flat_ids >= 0) & (flat_ids < E)
    sort_key = jnp.where(valid, flat_ids, E)
    order = jnp.argsort(sort_key, stable=True)
    counts = jnp.bincount(sort_key, length=E + 1)
    starts = jnp.cumsum(counts) - counts
    sorted_key = sort_key[order]
    rank = jnp.arange(T * k) - starts[sorted_key]
    # slot (expert, rank) -> sorted row; rows of skipped assignments and overflow go nowhere
    keep = (sorted_key < E) & (rank < capacity)
    dest = jnp.where(keep, sorted_key * capacity + rank, E * capacity)
    slot_rows = jnp.full((E * capacity + 1,), T * k, jnp.int32).at[dest].set(
        jnp.arange(T * k, dtype=jnp.int32))[:-1]
    padded_order = jnp.concatenate([order, jnp.zeros((1,), order.dtype)])
    slot_valid = slot_rows < T * k
    tokens = padded_order[slot_rows] // k
    xs = jnp.where(slot_valid[:, None], x2d[tokens], 0).reshape(E, capacity, -1)
    h = jnp.einsum("ech,ehf->ecf", xs, w_gate_up, preferred_element_type=jnp.float32)
    a = jax.nn.silu(h[..., :F]) * h[..., F:]
    out = jnp.einsum("ecf,efh->ech", a.astype(x2d.dtype), w_down,
                     preferred_element_type=jnp.float32).reshape(E * capacity, -1)
    flat_w = jnp.where(valid, topk_weights.reshape(-1), 0.0)
    slot_w = jnp.where(slot_valid, flat_w[padded_order[slot_rows]], 0.0)
    contrib = out * slot_w[:, None]
    y = jnp.zeros((T, out.shape[-1]), jnp.float32).at[tokens].add(
        jnp.where(slot_valid[:, None], contrib, 0.0))
    return y.astype(x2d.dtype)


def moe(x: jax.Array, params, *, return_aux: bool = False, implementation: str | None = None):
    """Reference MoE layer; same signature and semantics as :func:`jax_mok.moe`."""
    from jax_mok import api

    if implementation not in (None, "reference"):
        raise ValueError(
            "jax_mok.reference.moe: implementation must be None or 'reference', "
            f"got {implementation!r}"
        )
    return api.moe(x, params, return_aux=return_aux, implementation="reference")


__all__ = ["DROPPED", "moe", "routed_experts", "routed_experts_padded"]
