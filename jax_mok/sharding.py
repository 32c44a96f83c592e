"""Expert parallelism for users: the public names of :mod:`jax_mok.ep`, kept at this path.

When a mesh with an expert axis is in play, :func:`jax_mok.moe` partitions itself over it
(:mod:`jax_mok.ep.layer`: route, capacity, pack, exchange, the local kernels, combine). Three
ways to turn it on, first match wins: ``jax_mok.moe(x, params, mesh=mesh)``; the
:func:`expert_parallel` context around code that calls ``moe`` (e.g. Flax modules); the ambient
mesh of ``jax.set_mesh`` when it has the expert axis, or the mesh of expert weights placed with
a ``NamedSharding`` over it (see :mod:`jax_mok.ep.plan`).

The ``transport`` names how tokens travel: ``"xla"`` (``lax.all_to_all``, any backend);
``"peer"`` (NVLink peer memory, docs/peer-transport.md) only where
:func:`jax_mok.ep.workspace.peer_transport_available` says so, with a concrete ``Mesh``;
``"auto"`` (the default) picks ``"peer"`` where it is available, else ``"xla"``.
"""

from jax_mok.ep import (
    TRANSPORTS,
    ExpertParallel,
    check_expert_weights,
    expert_parallel,
    moe_expert_parallel,
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
