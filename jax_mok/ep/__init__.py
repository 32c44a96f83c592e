"""Expert parallelism (EP) for :func:`jax_mok.moe`: ``shard_map`` around the same kernels.

Modules, bottom-up: :mod:`~jax_mok.ep.pack` (capacity, dispatch indices, the send buffers and
the fixed-order home sum), :mod:`~jax_mok.ep.workspace` (the peer transport's symmetric
workspace), :mod:`~jax_mok.ep.plan` (:class:`ExpertParallel`, :func:`plan_for`, the
:func:`expert_parallel` context, mesh discovery), :mod:`~jax_mok.ep.transport`
(:class:`~jax_mok.ep.transport.XlaTransport`), :mod:`~jax_mok.ep.peer`
(:class:`~jax_mok.ep.peer.PeerTransport`), :mod:`~jax_mok.ep.layer` (the ``shard_map``: route ->
capacity -> pack -> transport -> combine). Users reach the public part through
:mod:`jax_mok.sharding`.
"""

from jax_mok.ep.layer import moe_expert_parallel
from jax_mok.ep.plan import (
    TRANSPORTS,
    ExpertParallel,
    check_expert_weights,
    expert_parallel,
    plan_for,
)

__all__ = [
    "TRANSPORTS",
    "ExpertParallel",
    "check_expert_weights",
    "expert_parallel",
    "moe_expert_parallel",
    "plan_for",
]
