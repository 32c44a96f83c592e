"""The plan of an expert-parallel call: :class:`ExpertParallel` (mesh, expert axis, token
axes, transport), how a ``moe`` call finds it (:func:`plan_for`), the :func:`expert_parallel`
context, mesh discovery, and the weight layouts EP can use without gathering experts.

Three ways to turn EP on, first match wins:

1. ``jax_mok.moe(x, params, mesh=mesh)`` (``expert_axis``, ``token_axes``, ``transport`` too);
2. ``with jax_mok.sharding.expert_parallel(mesh): ...`` around code that calls ``moe`` (e.g. Flax
   modules);
3. the ambient mesh of ``jax.set_mesh`` / ``jax.sharding.use_mesh`` when it has the expert axis, or
   the mesh of concretely ``NamedSharding``-placed expert weights sharded over the expert axis.

Inside ``jax.jit`` with auto (non-explicit) axes and no mesh in sight, a traced argument does not
say how it is sharded, so the call cannot know it should partition itself: XLA would then gather
the experts. Under ``jit``, give the mesh by one of 1-3 (the examples use 2).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import warnings
from collections.abc import Iterator, Sequence

import jax
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from jax_mok import tuning
from jax_mok.ep import workspace
from jax_mok.params import MoEParams

TRANSPORTS = ("xla", "peer", "auto")
_WARNED: set[str] = set()


def default_transport() -> str:
    """``JAX_MOK_TRANSPORT`` (``"auto"`` when unset): the transport when a call names none.
    ``"auto"`` picks ``"peer"`` where :func:`jax_mok.ep.workspace.peer_transport_available`
    allows it, else ``"xla"`` with a one-time warning giving the reason (none for a one-device
    expert axis, where nothing is exchanged); ``JAX_MOK_TRANSPORT=xla`` opts out."""
    return tuning.read("JAX_MOK_TRANSPORT") or "auto"


def resolve_transport(plan: ExpertParallel, quantization: str | None = None) -> ExpertParallel:
    """The plan with transport "xla" or "peer", asking for peer availability once: "auto" ->
    "peer" where available, else "xla" (warning once per reason); "peer" where unavailable ->
    NotImplementedError naming the reason. The FP8 layer (``quantization``) has no peer path:
    "peer" raises, "auto" picks "xla" (warning once where "peer" was available)."""
    if plan.transport == "xla":
        return plan
    available, reason = workspace.peer_transport_available(plan.mesh, plan.expert_axis)
    if quantization is not None:
        if plan.transport == "peer":
            raise NotImplementedError(
                f"transport='peer' has no FP8 path yet (quantization={quantization!r}); use "
                "transport='xla'")
        reason = f"the peer transport has no FP8 path yet (quantization={quantization!r})"
        if available and plan.ep_size > 1 and reason not in _WARNED:
            _WARNED.add(reason)
            warnings.warn(f"jax_mok: transport 'auto' uses 'xla': {reason}", stacklevel=3)
        return dataclasses.replace(plan, transport="xla")
    if plan.transport == "peer":
        if not available:
            # Only where every device of the expert axis is an NVLink peer with the CUDA build
            # (docs/peer-transport.md).
            raise NotImplementedError(
                f"transport='peer' is not available here: {reason}; use transport='xla'"
            )
        return plan
    if not available and reason not in _WARNED and plan.ep_size > 1:
        _WARNED.add(reason)
        warnings.warn(f"jax_mok: transport 'auto' uses 'xla': {reason}", stacklevel=3)
    return dataclasses.replace(plan, transport="peer" if available else "xla")


@dataclasses.dataclass(frozen=True)
class ExpertParallel:
    """How one ``moe`` call is spread over a mesh.

    Attributes:
      mesh: a ``Mesh`` or ``AbstractMesh`` containing ``expert_axis``.
      expert_axis: the mesh axis the expert weights' leading ``E`` dim is sharded over.
      token_axes: mesh axes the flattened tokens ``[T, H]`` are sharded over, major to minor. Must
        contain ``expert_axis``. ``None``: every mesh axis, in mesh order (e.g. ``("data",
        "expert")``), which is what a batch sharded ``P(("data", "expert"))`` already has.
      transport: ``"xla"`` (``lax.all_to_all``); ``"peer"``: NVLink peer memory where available
        (see :func:`jax_mok.ep.workspace.peer_transport_available`); ``"auto"``: ``"peer"`` where
        available, else ``"xla"`` with a one-time warning. Unnamed: ``JAX_MOK_TRANSPORT`` or
        ``"auto"``.
    """

    mesh: Mesh | AbstractMesh
    expert_axis: str = "expert"
    token_axes: tuple[str, ...] | None = None
    transport: str | None = None

    def __post_init__(self):
        if self.transport is None:
            object.__setattr__(self, "transport", default_transport())
        if not isinstance(self.mesh, Mesh | AbstractMesh):
            raise TypeError(
                f"mesh must be a jax.sharding.Mesh or AbstractMesh, got {type(self.mesh).__name__}"
            )
        names = tuple(self.mesh.axis_names)
        if self.expert_axis not in names:
            raise ValueError(
                f"expert_axis={self.expert_axis!r} is not an axis of the mesh; its axes are {names}"
            )
        if self.token_axes is not None:
            token_axes = (
                (self.token_axes,) if isinstance(self.token_axes, str) else tuple(self.token_axes)
            )
            object.__setattr__(self, "token_axes", token_axes)
            missing = [a for a in token_axes if a not in names]
            if missing:
                raise ValueError(
                    f"token_axes={token_axes} names axes not in the mesh: {missing}; "
                    f"mesh axes are {names}"
                )
            if self.expert_axis not in token_axes:
                raise ValueError(
                    f"token_axes={token_axes} must contain expert_axis={self.expert_axis!r}: "
                    "every device of the expert group routes its own tokens"
                )
            if len(set(token_axes)) != len(token_axes):
                raise ValueError(f"token_axes={token_axes} repeats an axis")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")

    @property
    def ep_size(self) -> int:
        """Devices in one expert-parallel group (the size of ``expert_axis``)."""
        return int(self.mesh.shape[self.expert_axis])

    @property
    def resolved_token_axes(self) -> tuple[str, ...]:
        if self.token_axes is None:
            return tuple(self.mesh.axis_names)
        return self.token_axes

    @property
    def token_shards(self) -> int:
        """How many blocks the tokens are split into (product of the token axes' sizes)."""
        return math.prod(int(self.mesh.shape[a]) for a in self.resolved_token_axes)


_CONTEXT: contextvars.ContextVar[ExpertParallel | None] = contextvars.ContextVar(
    "jax_mok_expert_parallel", default=None
)


@contextlib.contextmanager
def expert_parallel(mesh: Mesh | AbstractMesh | None = None, *, expert_axis: str = "expert",
                    token_axes: Sequence[str] | None = None,
                    transport: str | None = None) -> Iterator[ExpertParallel]:
    """Context in which every :func:`jax_mok.moe` call (also from Flax modules) runs EP.

    ``mesh=None`` takes the ambient mesh (``jax.set_mesh`` / ``use_mesh``) at entry. The context
    is read at trace time, so put it around the ``jax.jit``-ted call (or inside the function).

    Example::

        mesh = jax.make_mesh((2, 4), ("data", "expert"))
        with jax_mok.sharding.expert_parallel(mesh):
            y = jax.jit(model)(x)
    """
    if mesh is None:
        mesh = _ambient_mesh()
        if mesh is None:
            raise ValueError(
                "expert_parallel(mesh=None) needs an ambient mesh (jax.set_mesh / use_mesh); "
                "none is set"
            )
        mesh = _concrete(mesh)
    plan = ExpertParallel(mesh, expert_axis, token_axes, transport)
    token = _CONTEXT.set(plan)
    try:
        yield plan
    finally:
        _CONTEXT.reset(token)


def _ambient_mesh() -> Mesh | AbstractMesh | None:
    """The mesh set by ``jax.set_mesh`` / ``use_mesh``, or None."""
    get_abstract = getattr(jax.sharding, "get_abstract_mesh", None)
    if get_abstract is not None:
        mesh = get_abstract()
        if mesh is not None and not getattr(mesh, "empty", False) and mesh.axis_names:
            return mesh
    return None


def _concrete(mesh: Mesh | AbstractMesh) -> Mesh | AbstractMesh:
    """The concrete ``Mesh`` behind an ambient ``AbstractMesh`` where JAX keeps one
    (``jax.set_mesh`` does, also under ``jit``), else ``mesh`` itself: transport ``"auto"`` needs
    the devices to choose the peer path, which an ``AbstractMesh`` does not have."""
    if isinstance(mesh, Mesh):
        return mesh
    try:
        # Imported here: a private module with no public accessor under jit (jax 0.10 / 0.11),
        # probed on use; any failure means "not available".
        from jax._src import mesh as mesh_lib

        concrete = mesh_lib.get_concrete_mesh()
    except Exception:  # noqa: BLE001 - a private API: any failure means "not available"
        return mesh
    if (
        isinstance(concrete, Mesh)
        and not concrete.empty
        and tuple(concrete.axis_names) == tuple(mesh.axis_names)
        and dict(concrete.shape) == dict(mesh.shape)
    ):
        return concrete
    return mesh


def _weight_spec(w) -> tuple[PartitionSpec, Mesh | AbstractMesh] | None:
    """(spec, mesh) of a weight whose sharding is known at trace time, else None."""
    if isinstance(w, jax.core.Tracer):
        typeof = getattr(jax, "typeof", None)
        if typeof is None:
            return None
        sharding = getattr(typeof(w), "sharding", None)
        # Under auto (non-explicit) axes the traced spec says nothing; only trust explicit axes.
        if not isinstance(sharding, NamedSharding) or not explicit(sharding.mesh):
            return None
        return sharding.spec, sharding.mesh
    sharding = getattr(w, "sharding", None)
    if isinstance(sharding, NamedSharding):
        return sharding.spec, sharding.mesh
    return None


def _manual(mesh, axis: str) -> bool:
    """True inside a shard_map over ``axis`` (the caller already partitioned; don't nest)."""
    types = getattr(mesh, "axis_types", None)
    if not types:
        return False
    return "Manual" in str(dict(zip(mesh.axis_names, types, strict=True))[axis])


def explicit(mesh) -> bool:
    types = getattr(mesh, "axis_types", None)
    return bool(types) and any("Explicit" in str(t) for t in types)


def conform(value, spec: PartitionSpec, mesh):
    """Reshards an input to the spec shard_map expects when the mesh has explicit axes (whose
    shard_map checks input types instead of resharding). Only tokens move, or replicated experts
    get sliced: check_expert_weights has already refused layouts that would gather experts."""
    if value is None or not explicit(mesh):
        return value
    target = NamedSharding(mesh, spec) if isinstance(mesh, Mesh) else spec
    return jax.sharding.reshard(value, target)


def _spec_axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def check_expert_weights(params: MoEParams, plan: ExpertParallel) -> None:
    """Raises ValueError when a known weight sharding would make the call all-gather experts.

    Usable layouts: the leading ``E`` dim sharded over exactly ``plan.expert_axis`` (other dims
    not sharded), or fully replicated (each device then slices its experts locally).
    """
    for name in ("w_gate_up", "w_down"):
        known = _weight_spec(getattr(params, name))
        if known is None:
            continue
        spec, _ = known
        entries = tuple(spec) + (None,) * (3 - len(tuple(spec)))
        lead, rest = _spec_axes(entries[0]), [a for e in entries[1:] for a in _spec_axes(e)]
        if rest or lead not in ((), (plan.expert_axis,)):
            raise ValueError(
                f"params.{name} is sharded as {spec}, which expert parallelism cannot use "
                f"without gathering experts: expected PartitionSpec({plan.expert_axis!r}, None, "
                f"None) (experts over {plan.expert_axis!r}) or replicated"
            )


def plan_for(params: MoEParams, *, mesh=None, expert_axis: str = "expert",
             token_axes: Sequence[str] | None = None,
             transport: str | None = None) -> ExpertParallel | None:
    """The EP plan for one ``moe`` call, or None for the single-device path.

    Order: the explicit ``mesh`` argument; the :func:`expert_parallel` context; the ambient mesh
    (``jax.set_mesh`` / ``use_mesh``) if it has ``expert_axis``; the mesh of expert weights
    concretely sharded over ``expert_axis``.
    """
    if transport is not None and transport not in TRANSPORTS:
        raise ValueError(f"transport must be None or one of {TRANSPORTS}, got {transport!r}")
    if mesh is not None:
        return ExpertParallel(mesh, expert_axis, token_axes, transport)
    plan = _CONTEXT.get()
    if plan is not None:
        if transport is not None and transport != plan.transport:
            plan = dataclasses.replace(plan, transport=transport)
        return plan
    ambient = _ambient_mesh()
    if ambient is not None and expert_axis in ambient.axis_names and not _manual(
            ambient, expert_axis):
        return ExpertParallel(_concrete(ambient), expert_axis, token_axes, transport)
    known = _weight_spec(params.w_gate_up)
    if known is not None:
        spec, weight_mesh = known
        sharded = [a for e in tuple(spec) for a in _spec_axes(e)]
        if expert_axis in sharded:
            return ExpertParallel(weight_mesh, expert_axis, token_axes, transport)
        if sharded:
            raise ValueError(
                f"params.w_gate_up is sharded as {spec} over mesh axes {sharded}, but no mesh "
                f"with expert_axis={expert_axis!r} was given; pass mesh=... and "
                "expert_axis=<the axis the experts are sharded over>, or replicate the weights"
            )
    if transport is not None:
        raise ValueError(
            f"transport={transport!r} needs a mesh: pass mesh=..., use "
            "jax_mok.sharding.expert_parallel(...) or jax.set_mesh(...)"
        )
    return None


__all__ = [
    "TRANSPORTS",
    "ExpertParallel",
    "check_expert_weights",
    "conform",
    "default_transport",
    "explicit",
    "expert_parallel",
    "plan_for",
    "resolve_transport",
]
