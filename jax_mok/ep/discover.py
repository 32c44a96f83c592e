"""How a ``moe`` call finds its plan (:func:`plan_for`), first match wins:

1. the ``mesh=`` argument (with ``expert_axis``, ``token_axes``, ``transport``);
2. the :func:`jax_mok.ep.plan.expert_parallel` context;
3. the shardings of ``x`` and the expert weights where they are known at trace time (placed
   arrays, or traced arrays whose types have explicit axes — what ``jax.make_mesh`` gives by
   default): experts replicated -> data parallel over x's token axes; experts sharded over one
   axis -> expert parallel over it (data x expert with x's other token axes);
4. the ambient mesh (``jax.set_mesh`` / ``use_mesh``, or the mesh of a ``shard_map`` being
   traced) when it has ``expert_axis`` as a free (not manual) axis: expert parallel over it,
   tokens over every free axis.

None of these: :func:`jax_mok.api.moe` runs the single-device layer, whose routed experts are
:mod:`jax_mok.ep.partitioned`'s op where the arrays may be spread over several devices (auto
axes: their layout is known only when XLA partitions the program).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax

from jax_mok.ep import meshes
from jax_mok.ep.plan import TRANSPORTS, ExpertParallel, context_plan, weights_expert_axis
from jax_mok.params import MoEParams


def _same_mesh(found: list[meshes.Known]):
    """The mesh of the known shardings (a concrete one where any is concrete); ValueError when
    they name different meshes."""
    shapes = {tuple(dict(k.mesh.shape).items()) for k in found}
    if len(shapes) > 1:
        raise ValueError(
            "x and the expert weights are placed on different meshes "
            f"({[dict(k.mesh.shape) for k in found]}); put them on one mesh")
    concrete = [k.mesh for k in found if isinstance(k.mesh, jax.sharding.Mesh)]
    return concrete[0] if concrete else found[0].mesh


def _expert_axis(params: MoEParams) -> tuple[str | None, bool]:
    """(the axis the known expert weights' ``E`` dim is sharded over or None, whether any weight
    sharding is known); ValueError for a layout that would need the experts gathered."""
    specs = {}
    for name in ("w_gate_up", "w_down"):
        found = meshes.known(getattr(params, name))
        if found is not None:
            specs[f"params.{name}"] = found.spec
    return weights_expert_axis(specs), bool(specs)


def _x_token_axes(x, mesh) -> tuple[str, ...] | None:
    """The mesh axes x's token dims (all but the last) are sharded over, major to minor; None
    when x's sharding is not known."""
    found = meshes.known(x)
    if found is None or found.mesh.axis_names != mesh.axis_names:
        return None
    return tuple(a for entry in found.spec[:-1] for a in meshes.spec_axes(entry))


def inferred_plan(x, params: MoEParams, token_axes=None,
                  transport: str | None = None) -> ExpertParallel | None:
    """Step 3 of :func:`plan_for`: the plan the known shardings of ``x`` and the expert weights
    ask for, or None when they are not known (or span one device)."""
    found = [k for k in (meshes.known(x), meshes.known(params.w_gate_up),
                         meshes.known(params.w_down)) if k is not None]
    if not found:
        return None
    mesh = _same_mesh(found)
    free = meshes.free_axes(mesh)
    if meshes.size(mesh, free) < 2:
        return None
    expert_axis, weights_known = _expert_axis(params)
    if expert_axis is not None and expert_axis in meshes.manual_axes(mesh):
        raise ValueError(
            f"the expert weights are sharded over {expert_axis!r}, a manual axis here (a "
            "shard_map over it is being traced): call jax_mok.moe outside that shard_map")
    x_axes = _x_token_axes(x, mesh)
    if token_axes is None:
        if x_axes is None:
            if expert_axis is None:
                return None  # replicated weights, x unknown: nothing says how to split
            token_axes = None  # every free axis (tokens split over the whole mesh)
        else:
            token_axes = x_axes
            if expert_axis is not None and expert_axis not in token_axes:
                # Tokens replicated over the expert axis: each device of the group takes its
                # slice; y is given back in x's layout.
                token_axes = (*token_axes, expert_axis)
    if expert_axis is None and not weights_known and not token_axes:
        return None
    return ExpertParallel(mesh, expert_axis, token_axes, transport)


def plan_for(params: MoEParams, *, x=None, mesh=None, expert_axis: str | None = "expert",
             token_axes: Sequence[str] | None = None,
             transport: str | None = None) -> ExpertParallel | None:
    """The plan of one ``moe`` call, or None for the single-device layer (module docstring)."""
    if transport is not None and transport not in TRANSPORTS:
        raise ValueError(f"transport must be None or one of {TRANSPORTS}, got {transport!r}")
    if mesh is not None:
        return ExpertParallel(mesh, expert_axis, token_axes, transport)
    plan = context_plan()
    if plan is not None:
        if transport is not None and transport != plan.transport:
            plan = dataclasses.replace(plan, transport=transport)
        return plan
    plan = inferred_plan(x, params, token_axes, transport)
    if plan is not None:
        return plan
    ambient = meshes.ambient_mesh()
    if (ambient is not None and expert_axis is not None and expert_axis in ambient.axis_names
            and expert_axis not in meshes.manual_axes(ambient)):
        return ExpertParallel(meshes.concrete(ambient), expert_axis, token_axes, transport)
    if transport is not None:
        raise ValueError(
            f"transport={transport!r} needs a mesh: pass mesh=..., use "
            "jax_mok.sharding.expert_parallel(...) or jax.set_mesh(...)"
        )
    return None


__all__ = ["inferred_plan", "plan_for"]
