"""What a call can know about meshes and shardings at trace time: the ambient mesh, the concrete
mesh behind it, which axes are manual (inside a user's ``shard_map``) or explicit, and the
sharding of an array where it is known (a placed array, or a traced one whose type carries it).

Under auto axes a traced array's type carries its mesh but not its spec (``P(None, ...)``): such
an array says "on this mesh, layout decided later by XLA" — :mod:`jax_mok.ep.partitioned`
serves that case at compile time.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec


class Known(NamedTuple):
    """The sharding of an array known at trace time: its spec, padded with None to the array's
    rank, and its mesh (a ``Mesh`` for placed arrays, an ``AbstractMesh`` for traced ones)."""

    spec: tuple
    mesh: Mesh | AbstractMesh


def ambient_mesh() -> Mesh | AbstractMesh | None:
    """The mesh set by ``jax.set_mesh`` / ``use_mesh`` (or the mesh of the ``shard_map`` being
    traced), or None."""
    get_abstract = getattr(jax.sharding, "get_abstract_mesh", None)
    if get_abstract is not None:
        mesh = get_abstract()
        if mesh is not None and not getattr(mesh, "empty", False) and mesh.axis_names:
            return mesh
    return None


def concrete(mesh: Mesh | AbstractMesh) -> Mesh | AbstractMesh:
    """The concrete ``Mesh`` behind an ambient ``AbstractMesh`` where JAX keeps one
    (``jax.set_mesh`` does, also under ``jit``), else ``mesh`` itself: transport ``"auto"`` needs
    the devices to choose the peer path, which an ``AbstractMesh`` does not have. Inside a
    ``shard_map`` the abstract mesh (with its manual axes) is the one to nest under: kept."""
    if isinstance(mesh, Mesh) or manual_axes(mesh):
        return mesh
    try:
        # Imported here: a private module with no public accessor under jit (jax 0.10 / 0.11),
        # probed on use; any failure means "not available".
        from jax._src import mesh as mesh_lib

        found = mesh_lib.get_concrete_mesh()
    except Exception:  # noqa: BLE001 - a private API: any failure means "not available"
        return mesh
    if (
        isinstance(found, Mesh)
        and not found.empty
        and tuple(found.axis_names) == tuple(mesh.axis_names)
        and dict(found.shape) == dict(mesh.shape)
    ):
        return found
    return mesh


def _axis_types(mesh) -> dict[str, str]:
    types = getattr(mesh, "axis_types", None) or ()
    return {name: str(t) for name, t in zip(mesh.axis_names, types, strict=False)}


def manual_axes(mesh) -> tuple[str, ...]:
    """The axes of ``mesh`` that are manual (a ``shard_map`` over them is being traced)."""
    if mesh is None:
        return ()
    return tuple(a for a, t in _axis_types(mesh).items() if "Manual" in t)


def free_axes(mesh) -> tuple[str, ...]:
    """The axes of ``mesh`` a call may still partition over: all but the manual ones."""
    manual = manual_axes(mesh)
    return tuple(a for a in mesh.axis_names if a not in manual)


def explicit(mesh) -> bool:
    """Whether ``mesh`` has an explicit axis (shardings are part of the types)."""
    return mesh is not None and any("Explicit" in t for t in _axis_types(mesh).values())


def size(mesh, axes=None) -> int:
    """Devices along ``axes`` of ``mesh`` (all axes when None)."""
    axes = tuple(mesh.axis_names) if axes is None else axes
    return math.prod(int(mesh.shape[a]) for a in axes)


def spec_axes(entry) -> tuple[str, ...]:
    """The mesh axes of one entry of a ``PartitionSpec`` (None, a name or a tuple of names)."""
    if entry is None or entry is PartitionSpec.UNCONSTRAINED:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _sharding(a):
    """The sharding of a placed array, or the one a traced array's type carries (None if none)."""
    if isinstance(a, jax.core.Tracer):
        typeof = getattr(jax, "typeof", None)
        return getattr(typeof(a), "sharding", None) if typeof is not None else None
    return getattr(a, "sharding", None)


def known(a) -> Known | None:
    """The sharding of ``a`` where it is known at trace time, else None: a placed array with a
    ``NamedSharding``, or a traced array whose type has explicit axes. Under auto axes a traced
    type says nothing about the layout: None."""
    if a is None:
        return None
    sharding = _sharding(a)
    if not isinstance(sharding, NamedSharding):
        return None
    if isinstance(a, jax.core.Tracer) and not explicit(sharding.mesh):
        return None
    spec = tuple(sharding.spec)
    return Known(spec + (None,) * (a.ndim - len(spec)), sharding.mesh)


def traced_mesh(a) -> Mesh | AbstractMesh | None:
    """The mesh a traced (or placed) array lives on, whatever its axis types; None for arrays of
    one device or with no mesh in their type (e.g. created inside the traced function)."""
    if a is None:
        return None
    mesh = getattr(_sharding(a), "mesh", None)
    if mesh is None or getattr(mesh, "empty", True) or size(mesh) < 2:
        return None
    return mesh


__all__ = [
    "Known",
    "ambient_mesh",
    "concrete",
    "explicit",
    "free_axes",
    "known",
    "manual_axes",
    "size",
    "spec_axes",
    "traced_mesh",
]
