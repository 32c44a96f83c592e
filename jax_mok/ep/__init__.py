"""Partitioned execution of :func:`jax_mok.moe`: ``shard_map`` (and ``custom_partitioning``)
around the same kernels.

Modules, bottom-up: :mod:`~jax_mok.ep.pack` (capacity, dispatch indices, the send buffers and
the fixed-order home sum), :mod:`~jax_mok.ep.meshes` (what is known at trace time about meshes
and shardings), :mod:`~jax_mok.ep.errors` (the peer transport's errors under the deferred
check), :mod:`~jax_mok.ep.workspace` (the peer transport's symmetric workspace),
:mod:`~jax_mok.ep.plan` (:class:`ExpertParallel`, the :func:`expert_parallel` context, the
transport choice), :mod:`~jax_mok.ep.discover` (:func:`plan_for`: a call's plan from its
arguments, the context, its inputs' shardings, the ambient mesh), :mod:`~jax_mok.ep.transport`
(:class:`~jax_mok.ep.transport.XlaTransport`), :mod:`~jax_mok.ep.peer`
(:class:`~jax_mok.ep.peer.PeerTransport`), :mod:`~jax_mok.ep.layer` (the ``shard_map``: route ->
capacity -> pack -> transport -> combine), :mod:`~jax_mok.ep.partitioned` (the routed experts
as ops partitioned by the layout XLA chooses, for auto axes). Users reach the public part
through :mod:`jax_mok.sharding`.
"""

from jax_mok.ep import meshes, partitioned
from jax_mok.ep.discover import plan_for
from jax_mok.ep.layer import moe_expert_parallel, no_tokens
from jax_mok.ep.plan import (
    TRANSPORTS,
    ExpertParallel,
    check_expert_weights,
    expert_parallel,
)

__all__ = [
    "TRANSPORTS",
    "ExpertParallel",
    "check_expert_weights",
    "expert_parallel",
    "meshes",
    "moe_expert_parallel",
    "no_tokens",
    "partitioned",
    "plan_for",
]
