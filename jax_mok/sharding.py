"""Sharding for users: where to put a layer's weights, the logical axis names of the Flax
modules, and expert parallelism (the public names of :mod:`jax_mok.ep`).

Under ``jax.jit`` :func:`jax_mok.moe` reads the shardings of ``x`` and the expert weights and
partitions itself (:mod:`jax_mok.ep.discover`): data parallel where the experts are replicated,
expert parallel where their leading ``E`` dim is sharded over a mesh axis, data x expert where
the tokens are sharded too; the output is sharded like ``x``; experts are never gathered. So a
pjit-style program only places its arrays::

    mesh = jax.make_mesh((2, 4), ("data", "expert"))
    params = jax.device_put(params, jax_mok.sharding.param_shardings(params, mesh))
    x = jax.device_put(x, NamedSharding(mesh, P(("data", "expert"))))
    y = jax.jit(jax_mok.moe)(x, params)

A mesh can also be given at trace time, first match wins: ``jax_mok.moe(x, params, mesh=mesh)``;
the :func:`expert_parallel` context around code that calls ``moe`` (e.g. Flax modules); the
ambient mesh of ``jax.set_mesh`` when it has the expert axis. Expert parallelism planned at
trace time (those, or explicit axes) keeps the saved activations and can use transport
``"peer"``; found at compile time (auto axes, no mesh in sight) it uses ``"xla"`` and
recomputes the gate/up GEMM in the backward (jax_mok/ep/partitioned.py).

The ``transport`` names how tokens travel: ``"xla"`` (``lax.all_to_all``, any backend);
``"peer"`` (NVLink peer memory, docs/peer-transport.md) only where
:func:`jax_mok.ep.workspace.peer_transport_available` says so, with a concrete ``Mesh``;
``"auto"`` (the default) picks ``"peer"`` where it is available, else ``"xla"``. With
``PeerTuning(check="deferred")`` (no host synchronization per call) :func:`check_peer` /
:func:`peer_errors` report device-side errors on demand (:mod:`jax_mok.ep.errors`).
"""

from __future__ import annotations

from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from jax_mok.config import MoEConfig
from jax_mok.ep import (
    TRANSPORTS,
    ExpertParallel,
    check_expert_weights,
    expert_parallel,
    moe_expert_parallel,
    plan_for,
)
from jax_mok.ep.errors import check_peer, peer_errors
from jax_mok.params import MoEParams

# Logical names of the weight dims, as the Flax modules (jax_mok.nnx.MoE, jax_mok.linen.MoE)
# put them on their variables: ``expert`` for E, ``embed`` for H, ``mlp`` for F and S.
PRESETS: dict[str, dict[str, str]] = {
    "flax": {"expert": "expert", "embed": "embed", "mlp": "mlp"},
    # MaxText's logical names: "exp" for the expert dim (its rules map it to mesh axis "expert").
    "maxtext": {"expert": "exp", "embed": "embed", "mlp": "mlp"},
}


def _preset(preset: str) -> dict[str, str]:
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    return PRESETS[preset]


def logical_names(preset: str = "flax") -> dict[str, str]:
    """The Flax modules' ``expert_axis``, ``embed_axis``, ``mlp_axis`` arguments of a preset
    (:data:`PRESETS`: ``"flax"``, the modules' defaults, or ``"maxtext"``), e.g.
    ``jax_mok.nnx.MoE(config, rngs=rngs, **jax_mok.sharding.logical_names("maxtext"))``."""
    names = _preset(preset)
    return {"expert_axis": names["expert"], "embed_axis": names["embed"],
            "mlp_axis": names["mlp"]}


def logical_axis_rules(preset: str = "flax", *,
                       expert_axis: str | None = "expert") -> tuple[tuple[str, str | None], ...]:
    """Flax logical-axis rules (``(logical name, mesh axis)`` pairs, e.g. for
    ``flax.linen.logical_axis_rules`` or ``nnx.logical_to_mesh``) for a preset's names: experts
    over mesh axis ``expert_axis`` (None: replicated), ``embed`` and ``mlp`` unsharded — the
    layer shards experts only along E (sharding H or F would need them gathered)."""
    names = _preset(preset)
    return ((names["expert"], expert_axis), (names["embed"], None), (names["mlp"], None))


def param_shardings(params_or_config: MoEParams | MoEConfig, mesh: Mesh | AbstractMesh, *,
                    expert_axis: str | None = "expert") -> MoEParams:
    """The ``NamedSharding`` of every weight of a layer, as an :class:`jax_mok.MoEParams` tree
    (``None`` where the layer has no such weight) for ``jax.device_put``, ``jax.jit``'s
    ``in_shardings`` / ``out_shardings`` or an optimizer state's layout.

    ``w_gate_up [E, H, 2F]`` and ``w_down [E, F, H]``: ``E`` over ``expert_axis`` (None:
    replicated, data parallel); everything else (router, router bias, shared expert) replicated.

    Args:
      params_or_config: the layer's :class:`jax_mok.MoEParams` (its structure is kept) or its
        :class:`jax_mok.MoEConfig` (the weights that config has).
      mesh: a ``jax.sharding.Mesh`` (or ``AbstractMesh``).
      expert_axis: the mesh axis to shard experts over; its size must divide ``E``.
    """
    if isinstance(params_or_config, MoEParams):
        config, params = params_or_config.config, params_or_config
    elif isinstance(params_or_config, MoEConfig):
        config, params = params_or_config, None
    else:
        raise TypeError("params_or_config must be a jax_mok.MoEParams or MoEConfig, got "
                        f"{type(params_or_config).__name__}")
    if not isinstance(mesh, Mesh | AbstractMesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    names = tuple(mesh.axis_names)
    if expert_axis is not None:
        if expert_axis not in names:
            raise ValueError(f"expert_axis={expert_axis!r} is not an axis of the mesh; its axes "
                             f"are {names} (expert_axis=None replicates the experts)")
        size = int(mesh.shape[expert_axis])
        if config.num_experts % size:
            raise ValueError(f"num_experts={config.num_experts} must be divisible by the size "
                             f"of mesh axis {expert_axis!r} ({size})")
    replicated = NamedSharding(mesh, PartitionSpec())
    experts = NamedSharding(mesh, PartitionSpec(expert_axis, None, None))
    has = {
        "router_bias": config.routing == "sigmoid",
        "shared_gate_up": bool(config.shared_size),
        "shared_down": bool(config.shared_size),
        "shared_gate": config.shared_expert_gate,
    }
    if params is not None:
        has = {name: getattr(params, name) is not None for name in has}
    return MoEParams(
        router=replicated,
        router_bias=replicated if has["router_bias"] else None,
        w_gate_up=experts, w_down=experts,
        shared_gate_up=replicated if has["shared_gate_up"] else None,
        shared_down=replicated if has["shared_down"] else None,
        config=config,
        shared_gate=replicated if has["shared_gate"] else None,
    )


__all__ = [
    "PRESETS",
    "TRANSPORTS",
    "ExpertParallel",
    "check_expert_weights",
    "check_peer",
    "expert_parallel",
    "logical_axis_rules",
    "logical_names",
    "moe_expert_parallel",
    "param_shardings",
    "peer_errors",
    "plan_for",
]
