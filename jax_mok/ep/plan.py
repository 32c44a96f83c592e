"""The plan of a partitioned call: :class:`ExpertParallel` (mesh, expert axis, token axes,
transport), the :func:`expert_parallel` context, the transport choice, and the weight layouts a
plan can use without gathering experts. How a ``moe`` call finds its plan (the argument, the
context, the shardings of its inputs, the ambient mesh) is :mod:`jax_mok.ep.discover`.

A plan with ``expert_axis=None`` is data parallel: experts replicated, each device the layer on
its own tokens. With an expert axis, the experts' leading ``E`` dim is sharded over it and the
tokens travel to their experts (expert parallelism); other token axes make it data x expert.
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
from jax_mok.ep import meshes, workspace
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
    NotImplementedError naming the reason. The FP8 layer (``quantization``) runs on "peer" when
    asked for it by name (its rows travel quantized through the staged calls, jax_mok.ep.peer);
    "auto" picks "xla" for it (warning once where "peer" was available): that path has been
    checked against the XLA transport's on emulated CPU devices only, not yet on GPUs."""
    if plan.transport == "xla" or plan.expert_axis is None:
        return dataclasses.replace(plan, transport="xla")
    available, reason = workspace.peer_transport_available(plan.mesh, plan.expert_axis)
    if quantization is not None and plan.transport != "peer":
        reason = (f"the peer transport's FP8 path (quantization={quantization!r}) has not yet "
                  "run on GPUs; transport='peer' selects it")
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
      expert_axis: the mesh axis the expert weights' leading ``E`` dim is sharded over; None:
        the experts are replicated and each device runs the layer on its own tokens (data
        parallel, nothing exchanged).
      token_axes: mesh axes the flattened tokens ``[T, H]`` are sharded over, major to minor. Must
        contain ``expert_axis``. ``None``: every mesh axis that is not manual, in mesh order (e.g.
        ``("data", "expert")``), which is what a batch sharded ``P(("data", "expert"))`` has.
      transport: ``"xla"`` (``lax.all_to_all``); ``"peer"``: NVLink peer memory where available
        (see :func:`jax_mok.ep.workspace.peer_transport_available`); ``"auto"``: ``"peer"`` where
        available, else ``"xla"`` with a one-time warning. Unnamed: ``JAX_MOK_TRANSPORT`` or
        ``"auto"``.
    """

    mesh: Mesh | AbstractMesh
    expert_axis: str | None = "expert"
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
        if self.expert_axis is not None and self.expert_axis not in names:
            raise ValueError(
                f"expert_axis={self.expert_axis!r} is not an axis of the mesh; its axes are {names}"
            )
        if self.expert_axis in meshes.manual_axes(self.mesh):
            raise ValueError(
                f"expert_axis={self.expert_axis!r} is manual here (a shard_map over it is being "
                "traced): call jax_mok.moe outside that shard_map, or shard_map over other axes"
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
            if self.expert_axis is not None and self.expert_axis not in token_axes:
                raise ValueError(
                    f"token_axes={token_axes} must contain expert_axis={self.expert_axis!r}: "
                    "every device of the expert group routes its own tokens"
                )
            if len(set(token_axes)) != len(token_axes):
                raise ValueError(f"token_axes={token_axes} repeats an axis")
            manual = [a for a in token_axes if a in meshes.manual_axes(self.mesh)]
            if manual:
                raise ValueError(
                    f"token_axes={token_axes} names manual axes {manual} (a shard_map over them "
                    "is being traced: the layer already runs on their shards)"
                )
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")

    @property
    def ep_size(self) -> int:
        """Devices in one expert-parallel group (the size of ``expert_axis``; 1 without one)."""
        if self.expert_axis is None:
            return 1
        return int(self.mesh.shape[self.expert_axis])

    @property
    def resolved_token_axes(self) -> tuple[str, ...]:
        if self.token_axes is None:
            return meshes.free_axes(self.mesh)
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
        mesh = meshes.ambient_mesh()
        if mesh is None:
            raise ValueError(
                "expert_parallel(mesh=None) needs an ambient mesh (jax.set_mesh / use_mesh); "
                "none is set"
            )
        mesh = meshes.concrete(mesh)
    plan = ExpertParallel(mesh, expert_axis, token_axes, transport)
    token = _CONTEXT.set(plan)
    try:
        yield plan
    finally:
        _CONTEXT.reset(token)


def context_plan() -> ExpertParallel | None:
    """The plan of the innermost :func:`expert_parallel` context, or None."""
    return _CONTEXT.get()


def conform(value, spec: PartitionSpec, mesh):
    """Reshards an input to the spec shard_map expects when the mesh has explicit axes (whose
    shard_map checks input types instead of resharding). Only tokens move, or replicated experts
    get sliced: check_expert_weights has already refused layouts that would gather experts."""
    if value is None or not meshes.explicit(mesh):
        return value
    return jax.sharding.reshard(value, NamedSharding(mesh, spec))


def expected_weight_spec(expert_axis: str | None) -> str:
    """How to write the expert weights' sharding a plan can use, for error messages."""
    if expert_axis is None:
        return "PartitionSpec() (replicated)"
    return f"PartitionSpec({expert_axis!r}, None, None) or replicated"


def _weight_axes(spec: tuple) -> tuple[tuple[str, ...], list[str]]:
    """(the mesh axes of an expert weight's ``E`` dim, those of its other dims) in ``spec``."""
    return meshes.spec_axes(spec[0]), [a for e in spec[1:] for a in meshes.spec_axes(e)]


def weights_expert_axis(specs: dict[str, tuple]) -> str | None:
    """The mesh axis the expert weights' ``E`` dim is sharded over (None: replicated), from the
    specs (padded to rank 3) of the weights whose sharding is known, e.g.
    ``{"params.w_gate_up": spec}``. ValueError for a layout that would need the experts gathered:
    a dim other than ``E`` sharded, ``E`` over several axes, the two weights different along E.
    The trace-time plan (:mod:`jax_mok.ep.discover`) and the partitioner
    (:mod:`jax_mok.ep.partitioned`) both apply it: the same layouts fail with the same text."""
    leads = {}
    for name, spec in specs.items():
        lead, rest = _weight_axes(spec)
        if rest or len(lead) > 1:
            raise ValueError(
                f"jax_mok.moe: {name} is sharded as {PartitionSpec(*spec)}; the layer shards "
                "experts only along E over one mesh axis and would have to gather them: use "
                f"{expected_weight_spec(lead[0] if lead else 'expert')}")
        leads[name] = lead[0] if lead else None
    axes = list(dict.fromkeys(leads.values()))
    if len(axes) > 1:
        raise ValueError(
            f"jax_mok.moe: params.w_gate_up and params.w_down are sharded differently along E "
            f"({axes[0]} vs {axes[1]}); shard both as {expected_weight_spec(axes[0] or 'expert')}")
    return axes[0] if axes else None


def check_expert_weights(params: MoEParams, plan: ExpertParallel) -> None:
    """Raises ValueError when a known weight sharding would make the call all-gather experts.

    Usable layouts: the leading ``E`` dim sharded over exactly ``plan.expert_axis`` (other dims
    not sharded), or fully replicated (each device then slices its experts locally).
    """
    for name in ("w_gate_up", "w_down"):
        found = meshes.known(getattr(params, name))
        if found is None:
            continue
        lead, rest = _weight_axes(found.spec)
        if rest or lead not in ((), (plan.expert_axis,)):
            raise ValueError(
                f"params.{name} is sharded as {PartitionSpec(*found.spec)}, which the layer "
                "cannot use without gathering experts: expected "
                f"{expected_weight_spec(plan.expert_axis)}"
            )


__all__ = [
    "TRANSPORTS",
    "ExpertParallel",
    "check_expert_weights",
    "conform",
    "context_plan",
    "default_transport",
    "expected_weight_spec",
    "expert_parallel",
    "resolve_transport",
    "weights_expert_axis",
]
