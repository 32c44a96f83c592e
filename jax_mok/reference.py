"""The pure-JAX oracle: the same MoE layer with sort-based dispatch and ``lax.ragged_dot``.

This is what a JAX user writes today; it is differentiable by autodiff and serves as the oracle
for every kernel test. It also is the portable fallback where no kernel is built.

:func:`layer` is the single-device layer with the routed experts as an argument: the oracle
passes :func:`routed_experts`, :func:`jax_mok.moe` passes the kernels; routing, the shared
expert and the aux values are this one code.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jax_mok.params import MoEParams, validate
from jax_mok.quantization import cast_weight
from jax_mok.routing import DROPPED, aux_losses, rank_in_group, route


@jax.custom_vjp
def _zero_nonfinite_experts(w: jax.Array, finite: jax.Array) -> jax.Array:
    """``w [E, ...]`` with every expert whose ``finite [E]`` is False set to zero.

    The cotangent passes through unchanged (also for zeroed experts): the caller makes their rows
    NaN, so their weight gradients come out NaN rather than a misleading zero.
    """
    return jnp.where(finite.reshape((-1,) + (1,) * (w.ndim - 1)), w, jnp.zeros((), w.dtype))


def _zero_nonfinite_fwd(w, finite):
    return _zero_nonfinite_experts(w, finite), finite


def _zero_nonfinite_bwd(finite, g):
    return g, jnp.zeros(finite.shape, jax.dtypes.float0)


_zero_nonfinite_experts.defvjp(_zero_nonfinite_fwd, _zero_nonfinite_bwd)


def _finite_experts(w: jax.Array) -> jax.Array:
    """``[E]`` bool: every weight of the expert is finite."""
    return jnp.isfinite(w).all(axis=tuple(range(1, w.ndim)))


def routed_experts(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array,
                   w_gate_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """``y [T, H] = sum_j w[t, j] * SwiGLU_{ids[t, j]}(x_t)`` in float32, cast to x's dtype.

    ``x2d [T, H]``, ``topk_ids [T, k]`` int32 (ids outside ``[0, E)`` are skipped),
    ``topk_weights [T, k]`` float32, ``w_gate_up [E, H, 2F]``, ``w_down [E, F, H]``. GEMM operands
    keep x's dtype with float32 accumulation (the activation is rounded to x's dtype before the
    down GEMM, as the kernels do).

    Non-finite expert weights reach only that expert's rows, as in the kernels: ``ragged_dot``
    may run as dense products over every group with non-member rows zeroed (XLA:CPU does), where
    ``0 * NaN`` would spread one expert's NaN to every token. Such experts are therefore
    zeroed for the GEMMs and their rows' GEMM outputs multiplied by NaN instead (finite experts'
    rows by exactly 1, so finite results are unchanged).
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
    row_expert = sort_key[order]  # [T*k], E for skipped rows

    def poison(w):  # (w with non-finite experts zeroed, [T*k, 1] f32 row factor: 1 or NaN)
        finite = _finite_experts(w)
        finite_row = jnp.concatenate([finite, jnp.ones((1,), bool)])[row_expert]
        factor = jnp.where(finite_row, 1.0, jnp.nan).astype(jnp.float32)[:, None]
        return _zero_nonfinite_experts(w, finite), factor

    w_gate_up, gate_up_factor = poison(w_gate_up)
    w_down, down_factor = poison(w_down)
    h = jax.lax.ragged_dot(rows, w_gate_up, group_sizes, preferred_element_type=jnp.float32)
    h = h * gate_up_factor
    a = jax.nn.silu(h[:, :F]) * h[:, F:]  # [T*k, F] f32
    out = jax.lax.ragged_dot(a.astype(x2d.dtype), w_down, group_sizes,
                             preferred_element_type=jnp.float32)  # [T*k, H]
    out = out * down_factor
    weights = jnp.where(valid, topk_weights.reshape(-1), 0.0)[order]
    contrib = out * weights[:, None]
    unsorted = jnp.zeros_like(contrib).at[order].set(contrib)
    return unsorted.reshape(T, k, x2d.shape[1]).sum(1).astype(x2d.dtype)


def routed_experts_padded(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array,
                          w_gate_up: jax.Array, w_down: jax.Array, capacity: int) -> jax.Array:
    """The same function as :func:`routed_experts` through two padded batched einsums.

    Assignments are sorted by expert (stable, so token order within an expert) and placed in slot
    ``e * capacity + rank`` of an ``[E, capacity, H]`` buffer; empty slots stay zero and cost
    FLOPs like real ones. ``capacity`` (static) must be >= the largest expert count, e.g. measured
    on the host. XLA:CPU runs ``ragged_dot`` as one dense product per group (cost linear in E), so
    this form is the fast oracle for large E on the CPU; it is also the benchmarks' peer B2.
    Ids outside ``[0, E)`` are skipped. Returns ``y [T, H]`` in x's dtype (float32 combine, in
    slot order j = 0..k-1). Non-finite weights of one expert reach only its tokens: padded slots
    of that expert turn NaN too, but only occupied slots are read back.
    """
    T, k = topk_ids.shape
    E, H, two_f = w_gate_up.shape
    F = two_f // 2
    flat = topk_ids.reshape(-1)
    valid = (flat >= 0) & (flat < E)
    key = jnp.where(valid, flat, E)  # skipped assignments form group E
    rank, _ = rank_in_group(key, E + 1)
    trash = E * capacity  # one spare row takes skipped assignments
    slot = jnp.where(key < E, key * capacity + rank, trash).astype(jnp.int32)
    rows = jnp.repeat(x2d, k, axis=0)  # [T*k, H] row of each assignment, token-major
    buf = jnp.zeros((E * capacity + 1, H), x2d.dtype).at[slot].set(rows)
    buf = buf[:trash].reshape(E, capacity, H)
    h = jnp.einsum("ech,ehf->ecf", buf, w_gate_up, preferred_element_type=jnp.float32)
    a = (jax.nn.silu(h[..., :F]) * h[..., F:]).astype(x2d.dtype)  # [E, C, F]
    out = jnp.einsum("ecf,efh->ech", a, w_down, preferred_element_type=jnp.float32)
    out = jnp.concatenate([out.reshape(E * capacity, H), jnp.zeros((1, H), out.dtype)])
    picked = out[slot].reshape(T, k, H)  # [T, k, H] f32
    w = jnp.where(valid, topk_weights.reshape(-1), 0.0).reshape(T, k, 1)
    return (picked * w).sum(1).astype(x2d.dtype)


def swiglu_mlp(x2d: jax.Array, gate_up: jax.Array, down: jax.Array,
               gate: jax.Array | None = None) -> jax.Array:
    """Dense SwiGLU MLP (the fused shared expert): ``x2d [T, H]``, ``gate_up [H, 2S]``,
    ``down [S, H]`` -> ``[T, H]`` float32; operands in x's dtype, float32 accumulation.

    ``gate [H, 1]`` (Qwen2-MoE's shared-expert gate, or None) scales each token's output by
    ``sigmoid(x @ gate)``, computed in float32.
    """
    h = jnp.dot(x2d, gate_up.astype(x2d.dtype), preferred_element_type=jnp.float32)
    S = down.shape[0]
    a = jax.nn.silu(h[:, :S]) * h[:, S:]
    out = jnp.dot(a.astype(x2d.dtype), down.astype(x2d.dtype),
                  preferred_element_type=jnp.float32)
    if gate is not None:
        logit = jnp.dot(x2d.astype(jnp.float32), gate.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST)  # [T, 1]
        out = out * jax.nn.sigmoid(logit)
    return out


RoutedExperts = Callable[[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def layer(x: jax.Array, params: MoEParams, experts: RoutedExperts, *, return_aux: bool = False):
    """The single-device MoE layer with ``experts(x2d, topk_ids, topk_weights, w_gate_up,
    w_down) -> y [T, H]`` (x's dtype) as its routed experts: route, the routed experts (weights
    cast to x's dtype), the shared expert added in float32, the aux values. ``x [..., H]``,
    already validated; returns ``y`` like ``x`` (and ``aux`` when ``return_aux``)."""
    config = params.config
    lead = x.shape[:-1]
    x2d = x.reshape(-1, config.hidden_size)
    routing, routed_ids = route(x2d, params.router, params.router_bias, config)
    y = experts(x2d, routing.topk_ids, routing.topk_weights, cast_weight(params.w_gate_up, x.dtype),
                cast_weight(params.w_down, x.dtype))
    if config.shared_size:
        shared = swiglu_mlp(x2d, params.shared_gate_up, params.shared_down, params.shared_gate)
        y = (y.astype(jnp.float32) + shared).astype(x.dtype)
    y = y.reshape(*lead, config.hidden_size)
    if return_aux:
        return y, aux_losses(routing, routed_ids, config)
    return y


def moe(x: jax.Array, params: MoEParams, *, return_aux: bool = False,
        implementation: str | None = None):
    """Reference MoE layer: the semantics of :func:`jax_mok.moe` on one device, in pure JAX.

    ``x [..., H]`` float; returns ``y`` with x's shape and dtype (and the aux dict when
    ``return_aux``). It never partitions itself over a mesh: under one, XLA's partitioner
    places it like any JAX code.
    """
    if implementation not in (None, "reference"):
        raise ValueError(
            "jax_mok.reference.moe: implementation must be None or 'reference', "
            f"got {implementation!r}"
        )
    validate(x, params)
    return layer(x, params, routed_experts, return_aux=return_aux)


__all__ = ["DROPPED", "layer", "moe", "routed_experts", "routed_experts_padded", "swiglu_mlp"]
