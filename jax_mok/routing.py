"""Routing in JAX: router logits, expert selection, routing weights, capacity, aux losses.

Everything here is small next to the expert GEMMs and stays differentiable: the router's
gradient reaches it through the routing weights (``d_topk_weights`` from the kernels).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from jax_mok.config import MoEConfig

DROPPED = -1  # expert id of an assignment dropped by the capacity limit; kernels skip it


def _partial_shard_map() -> bool:
    """Whether a ``shard_map`` over some (not all) mesh axes is being traced: there the
    partitioner hands ``custom_partitioning`` shardings without a mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    types = [str(t) for t in (getattr(mesh, "axis_types", None) or ())]
    manual = sum("Manual" in t for t in types)
    return 0 < manual < len(types)


@functools.cache
def _rowwise_top_k(k: int, ndim: int):
    """``lax.top_k`` over the last dim that XLA partitions over the leading (token) dims: the
    partitioner would otherwise gather the scores of every token to each device for the TopK
    custom call (seen on XLA:CPU). Under ``jax.vmap`` the batch is folded into the rows."""

    def partition(mesh, arg_shapes, result_shape):
        spec = tuple(arg_shapes[0].sharding.spec)
        spec = (spec + (None,) * ndim)[: ndim - 1] + (None,)
        rows = NamedSharding(mesh, PartitionSpec(*spec))
        results = jax.tree.map(lambda _: rows, result_shape)  # top_k's own (list) structure
        return mesh, lambda a: jax.lax.top_k(a, k), results, (rows,)

    def infer(mesh, arg_shapes, result_shape):
        spec = tuple(arg_shapes[0].sharding.spec)
        rows = NamedSharding(mesh, PartitionSpec(*(spec + (None,) * ndim)[: ndim - 1], None))
        return jax.tree.map(lambda _: rows, result_shape)

    op = custom_partitioning(lambda a: jax.lax.top_k(a, k))
    dims = " ".join(f"d{i}" for i in range(ndim - 1))
    op.def_partition(partition, infer_sharding_from_operands=infer,
                     sharding_rule=f"{dims} e -> {dims} k, {dims} k")
    batched = jax.custom_batching.custom_vmap(op)

    @batched.def_vmap
    def _(axis_size, in_batched, a):
        values, ids = _rowwise_top_k(k, ndim)(a.reshape(-1, *a.shape[2:]))
        lead = (axis_size, a.shape[1])
        return ([values.reshape(*lead, *values.shape[1:]), ids.reshape(*lead, *ids.shape[1:])],
                [True, True])

    return batched


def top_k(a: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``jax.lax.top_k(a, k)`` (values, int32 indices; ties to the lower index), partitioned
    over a's leading dims when XLA spreads them over devices. Not differentiable: routing only
    takes the indices of stop-gradient scores."""
    if _partial_shard_map():
        return jax.lax.top_k(a, k)
    return _rowwise_top_k(k, a.ndim)(a)


@dataclasses.dataclass(frozen=True)
class Routing:
    """Result of routing T tokens.

    Attributes:
      topk_ids: [T, k] int32 expert of each assignment, ``DROPPED`` (-1) when over capacity.
      topk_weights: [T, k] float32 routing weights (normalised and scaled).
      logits: [T, E] float32 router logits.
      scores: [T, E] float32 softmax / sigmoid scores.
      expert_counts: [E] int32 assignments each expert processes (after capacity drops).
      dropped: int32 number of dropped assignments.
    """

    topk_ids: jax.Array
    topk_weights: jax.Array
    logits: jax.Array
    scores: jax.Array
    expert_counts: jax.Array
    dropped: jax.Array


def _group_limited(selection: jax.Array, config: MoEConfig) -> jax.Array:
    """Masks experts outside the ``topk_group`` best groups with -inf.

    A group's score is the sum of its two highest selection scores (its one score for groups of
    one expert).
    """
    T, E = selection.shape
    per_group = E // config.n_group
    grouped = selection.reshape(T, config.n_group, per_group)
    best = top_k(grouped, min(2, per_group))[0]
    group_scores = best.sum(-1)  # [T, n_group]
    _, keep = top_k(group_scores, config.topk_group)  # [T, topk_group]
    group_mask = jnp.zeros((T, config.n_group), bool).at[jnp.arange(T)[:, None], keep].set(True)
    expert_mask = jnp.repeat(group_mask, per_group, axis=1)
    return jnp.where(expert_mask, selection, -jnp.inf)


def rank_in_group(keys: jax.Array, num_groups: int) -> tuple[jax.Array, jax.Array]:
    """``(rank, counts)``: for each entry of ``keys [N]`` (ints in ``[0, num_groups)``) its rank
    among the entries with the same key, in index order (int32 ``[N]``), and the entries per key
    (int32 ``[num_groups]``). With token-major assignment ids, the rank within an expert follows
    token order."""
    order = jnp.argsort(keys, stable=True)
    counts = jnp.bincount(keys, length=num_groups).astype(jnp.int32)
    starts = jnp.cumsum(counts) - counts
    rank_sorted = jnp.arange(keys.shape[0], dtype=jnp.int32) - starts[keys[order]]
    return jnp.zeros(keys.shape, jnp.int32).at[order].set(rank_sorted), counts


def count_per_expert(ids: jax.Array, num_experts: int) -> jax.Array:
    """Valid (non-DROPPED) assignments per expert, int32 ``[E]``."""
    valid = ids >= 0
    return jnp.zeros((num_experts,), jnp.int32).at[jnp.where(valid, ids, 0).reshape(-1)].add(
        valid.reshape(-1).astype(jnp.int32)
    )


def _apply_capacity(ids: jax.Array, config: MoEConfig) -> jax.Array:
    """Replaces assignments past each expert's capacity by DROPPED, earliest tokens first."""
    flat = ids.reshape(-1)
    rank, _ = rank_in_group(flat, config.num_experts)
    kept = jnp.where(rank < config.capacity(ids.shape[0]), flat, DROPPED)
    return kept.reshape(ids.shape).astype(jnp.int32)


def route(x2d: jax.Array, router: jax.Array, router_bias: jax.Array | None,
          config: MoEConfig) -> tuple[Routing, jax.Array]:
    """Routes tokens ``x2d [T, H]`` with ``router [H, E]`` per the semantics of MoEConfig.

    Returns the Routing (capacity applied) and the routed ids before capacity drops [T, k],
    which the load-balancing loss counts.
    """
    precision = getattr(jax.lax.Precision, config.router_precision.upper())
    logits = jnp.dot(x2d.astype(jnp.float32), router.astype(jnp.float32), precision=precision)
    if config.routing == "softmax":
        scores = jax.nn.softmax(logits, axis=-1)
        selection = scores
    else:
        scores = jax.nn.sigmoid(logits)
        selection = scores
        if router_bias is not None:
            selection = scores + jax.lax.stop_gradient(router_bias.astype(jnp.float32))
    selection = jax.lax.stop_gradient(selection)
    if config.n_group is not None:
        selection = _group_limited(selection, config)
    _, ids = top_k(selection, config.top_k)  # ties go to the lower index
    ids = ids.astype(jnp.int32)
    weights = jnp.take_along_axis(scores, ids, axis=-1)
    if config.norm_topk_prob:
        weights = weights / weights.sum(-1, keepdims=True)
    weights = weights * config.routed_scaling_factor

    if config.capacity_factor is not None:
        kept_ids = _apply_capacity(ids, config)
    else:
        kept_ids = ids
    expert_counts = count_per_expert(kept_ids, config.num_experts)
    dropped = (kept_ids < 0).sum().astype(jnp.int32)
    routing = Routing(kept_ids, weights, logits, scores, expert_counts, dropped)
    return routing, ids


def aux_losses(routing: Routing, routed_ids: jax.Array, config: MoEConfig, *,
               reduce=None, num_tokens: int | None = None) -> dict:
    """``load_balancing_loss = E * sum_e f_e * P_e`` and ``router_z_loss``.

    ``f_e`` is the share of the T*k routing decisions (before capacity drops) that chose e;
    ``P_e`` the mean score of e over tokens. ``router_z_loss = mean(logsumexp(logits)^2)``.
    With the tokens sharded (expert parallelism), ``reduce`` sums a per-shard value over the
    shards (a ``psum`` over the token axes) and ``num_tokens`` is the global token count.
    With no tokens both losses are 0.
    """
    T, k = routed_ids.shape
    E = config.num_experts
    reduce = reduce or (lambda v: v)
    num_tokens = num_tokens or T
    # With no tokens every sum is 0; dividing by 1 instead of 0 makes the losses 0, not NaN.
    denominator = max(num_tokens, 1)
    f = reduce(jnp.zeros((E,), jnp.float32).at[routed_ids.reshape(-1)].add(1.0)) / (
        denominator * k)
    P = reduce(routing.scores.sum(0)) / denominator
    lbl = E * jnp.sum(jax.lax.stop_gradient(f) * P)
    z = reduce(jnp.sum(jax.nn.logsumexp(routing.logits, axis=-1) ** 2)) / denominator
    return {
        "load_balancing_loss": lbl,
        "router_z_loss": z,
        "expert_counts": reduce(routing.expert_counts),
        "dropped_tokens": reduce(routing.dropped),
    }
