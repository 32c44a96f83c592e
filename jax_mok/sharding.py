"""Expert parallelism (EP) for :func:`jax_mok.moe`: ``shard_map`` around the same kernels.

When a mesh with an expert axis is in play, ``jax_mok.moe`` partitions itself::

    per device (tokens x_loc [T_loc, H], experts E_loc = E / EP of them):
      route x_loc (replicated router)          -> ids [T_loc, k], weights [T_loc, k]
      capacity (optional, global semantics)    -> ids past an expert's capacity become -1
      pack: each token once per destination device, with its slots for that device
            (ids rebased to the destination's local experts, other slots -1, weight 0)
                                               -> send [EP, R, H], [EP, R, k], [EP, R, k]
      all_to_all over the expert axis          -> recv [EP, R, ...] (chunk s came from device s)
      local experts: routed_experts(FFI)       -> out [EP * R, H]; padding rows (all ids -1) skipped
      all_to_all back, combine per token in a fixed order (destination 0..EP-1, float32)

``R`` is static: ``T_loc`` when dropless (a token goes at most once to each device, so this can
never overflow), ``min(T_loc, E_loc * C)`` with a capacity ``C`` per expert (no device can be
sent more than ``C`` assignments per local expert once capacity is applied). The capacity keeps the
single-device meaning (``C = ceil(capacity_factor * T * k / E)`` over the global ``T``, earliest
tokens first): devices exchange their per-expert counts (``E`` integers) to rank their assignments
globally, so EP and single-device calls drop the same assignments. The result, the aux values and
the gradients equal the single-device call's up to float summation order.

The ``transport`` switch names how tokens travel: ``"xla"`` (``lax.all_to_all``, any backend,
the default); ``"peer"`` (kernels storing rows into peers' memory over NVLink, staged version in
:mod:`jax_mok.peer`, docs/peer-transport.md; run on 2 x H200) only where
:func:`jax_mok.workspace.peer_transport_available` says so, with a concrete ``Mesh``; elsewhere
it raises ``NotImplementedError`` with the reason.

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
import os
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from jax_mok.config import MoEConfig
from jax_mok.params import MoEParams
from jax_mok.routing import (
    DROPPED,
    Routing,
    aux_losses,
    count_per_expert,
    rank_in_group,
    route,
)

TRANSPORTS = ("xla", "peer", "auto")
_WARNED: set[str] = set()


def _default_transport() -> str:
    """``JAX_MOK_TRANSPORT`` (``"auto"`` when unset): the transport when a call names none.
    ``"auto"`` picks ``"peer"`` where :func:`jax_mok.workspace.peer_transport_available` allows
    it, else ``"xla"`` with a one-time warning giving the reason (none for a one-device expert
    axis, where nothing is exchanged). The default since the peer path passed its multi-GPU
    tests on 2 x H200 (BENCHMARKS.md, 183807a); ``JAX_MOK_TRANSPORT=xla`` opts out."""
    value = os.environ.get("JAX_MOK_TRANSPORT", "auto")
    if value not in TRANSPORTS:
        raise ValueError(f"JAX_MOK_TRANSPORT must be one of {TRANSPORTS}, got {value!r}")
    return value


def _resolve_transport(plan: ExpertParallel) -> ExpertParallel:
    """The plan with transport "xla" or "peer", asking for peer availability once: "auto" ->
    "peer" where available, else "xla" (warning once per reason); "peer" where unavailable ->
    NotImplementedError naming the reason."""
    if plan.transport == "xla":
        return plan
    from jax_mok import workspace

    available, reason = workspace.peer_transport_available(plan.mesh, plan.expert_axis)
    if plan.transport == "peer":
        if not available:
            # Only where every device of the expert axis is an NVLink peer with the CUDA build
            # (docs/peer-transport.md).
            raise NotImplementedError(
                f"transport='peer' is not available here: {reason}; use transport='xla'"
            )
        return plan
    if not available and reason not in _WARNED and plan.ep_size > 1:
        import warnings

        _WARNED.add(reason)
        warnings.warn(f"jax_mok: transport 'auto' uses 'xla': {reason}", stacklevel=3)
    return dataclasses.replace(plan, transport="peer" if available else "xla")

if hasattr(jax, "shard_map"):  # jax >= 0.7: jax.shard_map(check_vma=...)
    def _shard_map(f, mesh, in_specs, out_specs):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=False)
else:  # older jax: jax.experimental.shard_map.shard_map(check_rep=...)
    from jax.experimental.shard_map import shard_map as _experimental_shard_map

    def _shard_map(f, mesh, in_specs, out_specs):
        return _experimental_shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                       check_rep=False)


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
        (see :func:`jax_mok.workspace.peer_transport_available`); ``"auto"``: ``"peer"`` where
        available, else ``"xla"`` with a one-time warning. Unnamed: ``JAX_MOK_TRANSPORT`` or
        ``"auto"``.
    """

    mesh: Mesh | AbstractMesh
    expert_axis: str = "expert"
    token_axes: tuple[str, ...] | None = None
    transport: str | None = None

    def __post_init__(self):
        if self.transport is None:
            object.__setattr__(self, "transport", _default_transport())
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
        from jax._src import mesh as mesh_lib  # no public accessor under jit (jax 0.10 / 0.11)

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
        if not isinstance(sharding, NamedSharding) or not _explicit(sharding.mesh):
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


def _explicit(mesh) -> bool:
    types = getattr(mesh, "axis_types", None)
    return bool(types) and any("Explicit" in str(t) for t in types)


def _conform(value, spec: PartitionSpec, mesh):
    """Reshards an input to the spec shard_map expects when the mesh has explicit axes (whose
    shard_map checks input types instead of resharding). Only tokens move, or replicated experts
    get sliced: check_expert_weights has already refused layouts that would gather experts."""
    if value is None or not _explicit(mesh):
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


def _buffer_rows(config: MoEConfig, tokens_local: int, tokens_global: int, ep: int) -> int:
    """Static rows R of each (source, destination) chunk, safe against overflow."""
    capacity = config.capacity(tokens_global)
    if capacity is None:
        return tokens_local
    return max(1, min(tokens_local, (config.num_experts // ep) * capacity))


def _global_capacity(ids: jax.Array, config: MoEConfig, token_axes: tuple[str, ...],
                     tokens_global: int) -> jax.Array:
    """Single-device capacity semantics on sharded tokens: -1 past an expert's global capacity.

    Assignments are ranked per expert in global token order: the count of earlier devices
    (all-gathered, ``E`` ints each) plus the rank among this device's assignments.
    """
    flat = ids.reshape(-1)  # token-major: rank within an expert follows token order
    rank, counts = rank_in_group(flat, config.num_experts)
    all_counts = jax.lax.all_gather(counts, token_axes)  # [D, E]
    me = jax.lax.axis_index(token_axes)
    offset = (jnp.cumsum(all_counts, axis=0) - all_counts)[me]  # earlier devices' counts [E]
    keep = offset[flat] + rank < config.capacity(tokens_global)
    return jnp.where(keep, flat, DROPPED).reshape(ids.shape).astype(jnp.int32)


def _dispatch_indices(ids: jax.Array, ep: int, experts_local: int, rows: int):
    """Where each token goes: per destination, its buffer row and which slots travel.

    Returns ``dest_of_slot [T, k]`` (destination device, -1 for dropped slots),
    ``sent [T, EP]`` bool, ``row [T, EP]`` int32 (buffer row, valid where sent),
    ``source_token [EP, R]`` int32 (token of each buffer row, ``T`` for padding) and
    ``overflow`` (int32 slots that did not fit; 0 whenever ``rows`` is the safe size).
    """
    T, k = ids.shape
    valid = ids >= 0
    dest_of_slot = jnp.where(valid, ids // experts_local, -1)  # [T, k]
    devices = jnp.arange(ep, dtype=jnp.int32)
    goes = (dest_of_slot[:, :, None] == devices[None, None, :]).any(1)  # [T, EP]
    row = jnp.cumsum(goes, axis=0, dtype=jnp.int32) - 1  # token order within a destination
    sent = goes & (row < rows)
    overflow = jnp.sum(
        (dest_of_slot[:, :, None] == devices[None, None, :])
        & (goes & ~sent)[:, None, :]
    ).astype(jnp.int32)
    tokens = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[:, None], (T, ep))
    dests = jnp.broadcast_to(devices[None, :], (T, ep))
    source_token = jnp.full((ep, rows), T, jnp.int32).at[
        jnp.where(sent, dests, ep), jnp.where(sent, row, rows)
    ].set(tokens, mode="drop")
    return dest_of_slot, sent, row, source_token, overflow


def _sum_home_rows(buffer: jax.Array, row: jax.Array, sent: jax.Array) -> jax.Array:
    """``[T, ...]`` float32: for each token the sum, over destinations ``d = 0..EP-1`` in
    ascending order, of its row ``row[t, d]`` of ``buffer [EP, R, ...]`` where ``sent[t, d]``.
    The fixed-order per-token reduction of the combine (and of the packing gather's transpose).

    Written as EP whole-row gathers added in turn (``((0 + b_0) + b_1) + ...``, the order of the
    peer combine kernel) rather than one ``[T, EP, ...]`` gather reduced over its middle axis:
    the same sums (bitwise, for EP = 2 any order is this one), and XLA fuses row gathers and
    adds into one pass, where the middle-axis reduction of a gather ran as a slow reduce fusion
    (0.67 ms of B4's 2.74-ms forward on S1 / 8192, 2 x H200).

    On CUDA, ``[EP, R, H]`` buffers of 16-byte rows go to the ``mok_home_sum`` kernel instead
    (the same float32 adds in the same order, 16-byte loads; bitwise equal on 2 x H200). XLA's
    gather-add fusion took 0.42-0.48 ms for S1 / 8192's ``[T, H]``; with the kernel B4's forward
    went from 2.44 to 2.02 ms (docs/perf-notes.md, 2026-11-30). ``JAX_MOK_HOME_SUM`` (read at
    trace time): ``auto`` (default: the kernel where the CUDA extension is built), ``kernel``,
    ``xla``."""
    if _home_sum_kernel_applies(buffer):
        home_row = jnp.where(sent, row, -1).astype(jnp.int32)
        return jax.lax.platform_dependent(
            buffer, home_row, cuda=_home_sum_call, default=lambda b, h: _home_sum_xla(b, row, sent))
    return _home_sum_xla(buffer, row, sent)


def _home_sum_kernel_applies(buffer: jax.Array) -> bool:
    setting = os.environ.get("JAX_MOK_HOME_SUM", "auto")
    if setting == "xla" or buffer.ndim != 3:
        return False
    if setting != "kernel":
        from jax_mok import _ffi

        if not _ffi.kernels_built("cuda"):
            return False
    per_vector = {jnp.dtype(jnp.bfloat16): 8, jnp.dtype(jnp.float32): 4}.get(buffer.dtype)
    return per_vector is not None and buffer.shape[2] % per_vector == 0


def _home_sum_call(buffer: jax.Array, home_row: jax.Array) -> jax.Array:
    out = jax.ShapeDtypeStruct((home_row.shape[0], buffer.shape[2]), jnp.float32)
    return jax.ffi.ffi_call("mok_home_sum", out)(buffer, home_row)


def _home_sum_xla(buffer: jax.Array, row: jax.Array, sent: jax.Array) -> jax.Array:
    ep, rows = buffer.shape[0], buffer.shape[1]
    index = jnp.clip(row, 0, rows - 1)
    total = None
    for d in range(ep):
        picked = buffer[d][index[:, d]].astype(jnp.float32)  # [T, ...]
        mask = sent[:, d].reshape(sent.shape[:1] + (1,) * (picked.ndim - 1))
        term = jnp.where(mask, picked, 0.0)
        total = (0.0 + term) if total is None else total + term  # 0 + b_0: as the kernel does
    return total


def _experts_on_rows(recv_x: jax.Array, recv_ids: jax.Array, recv_w: jax.Array,
                     w_gate_up: jax.Array, w_down: jax.Array, implementation: str,
                     save_activations: bool | None, quantization: str | None = None) -> jax.Array:
    """This device's experts on the rows it received, ``[EP, R, H]`` (ids, weights
    ``[EP, R, k]``; local expert ids) → ``[EP, R, H]``: each row's local experts summed.
    With ``quantization``, the FP8 layer (:mod:`jax_mok.fp8`; its weight-gradient token blocks
    then follow the received rows' order)."""
    from jax_mok import autodiff, fp8  # autodiff imports routing; keep the import cycle one-way

    ep, rows, H = recv_x.shape
    args = (recv_x.reshape(ep * rows, H), recv_ids.reshape(ep * rows, -1),
            recv_w.reshape(ep * rows, -1), w_gate_up, w_down)
    if quantization is not None:
        out = fp8.routed_experts_fp8(*args, quantization, implementation=implementation)
    else:
        out = autodiff.routed_experts(*args, implementation=implementation,
                                      save_activations=save_activations)
    return out.reshape(ep, rows, H)


def _fp8_transport(plan: ExpertParallel, quantization: str) -> ExpertParallel:
    """The FP8 layer runs over the "xla" transport only: "auto" becomes "xla" (with a one-time
    warning where the peer transport would have been chosen), "peer" raises."""
    if plan.transport == "xla":
        return plan
    if plan.transport == "peer":
        raise NotImplementedError(
            f"transport='peer' has no FP8 path yet (config.quantization={quantization!r}); "
            "use transport='xla'")
    from jax_mok import workspace

    reason = "the peer transport has no FP8 path yet"
    if plan.ep_size > 1 and reason not in _WARNED and workspace.peer_transport_available(
            plan.mesh, plan.expert_axis)[0]:
        import warnings

        _WARNED.add(reason)
        warnings.warn(f"jax_mok: transport 'auto' uses 'xla' with quantization={quantization!r}: "
                      f"{reason}", stacklevel=4)
    return dataclasses.replace(plan, transport="xla")


def _gather_rows(values: jax.Array, token_of_row: jax.Array, padding: jax.Array) -> jax.Array:
    """``values[token_of_row]`` (``[T, ...]`` → ``[EP, R, ...]``), zero on padding rows."""
    picked = values[token_of_row]  # [EP, R, ...]
    mask = padding.reshape(padding.shape + (1,) * (picked.ndim - padding.ndim))
    return jnp.where(mask, jnp.zeros((), values.dtype), picked)


@jax.custom_vjp
def _home_sum(buffer: jax.Array, row: jax.Array, sent: jax.Array, token_of_row: jax.Array,
              padding: jax.Array) -> jax.Array:
    """:func:`_sum_home_rows` with its transpose written as a gather: row ``(d, i)`` of the
    buffer feeds exactly one token (``token_of_row[d, i]``, or none on padding), so the cotangent
    of the buffer is that token's cotangent — what autodiff's scatter-add computes (bitwise: one
    term per row), without the scatter (0.24-0.32 ms per scatter fusion on S1 / 8192's training
    step, 2 x H200)."""
    return _sum_home_rows(buffer, row, sent)


def _home_sum_fwd(buffer, row, sent, token_of_row, padding):
    like = jnp.zeros((0,), buffer.dtype)  # carries the buffer's dtype (residuals are arrays)
    return _sum_home_rows(buffer, row, sent), (token_of_row, padding, like)


def _home_sum_bwd(residuals, ct):
    token_of_row, padding, like = residuals
    return _gather_rows(ct, token_of_row, padding).astype(like.dtype), None, None, None, None


_home_sum.defvjp(_home_sum_fwd, _home_sum_bwd)


@jax.custom_vjp
def _pack_rows(values: jax.Array, token_of_row: jax.Array, padding: jax.Array, row: jax.Array,
               sent: jax.Array) -> jax.Array:
    """``values[token_of_row]`` (``[T, ...]`` → ``[EP, R, ...]``), zero on padding rows.

    The transpose of a gather is a scatter-add, which XLA's GPU backend runs with atomics: a
    token sent to several devices then gets its ``dx`` summed in a varying order (seen on 2 x H200:
    1-ulp bf16 differences between identical calls). This one gathers back instead: the
    cotangent of token ``t`` is :func:`_sum_home_rows` of the buffer's cotangent, rounded once —
    deterministic by construction.
    """
    return _pack_rows_fwd(values, token_of_row, padding, row, sent)[0]


def _pack_rows_fwd(values, token_of_row, padding, row, sent):
    return _gather_rows(values, token_of_row, padding), (row, sent)


def _pack_rows_bwd(residuals, ct):
    row, sent = residuals  # [T, EP] each
    return _sum_home_rows(ct, row, sent).astype(ct.dtype), None, None, None, None


_pack_rows.defvjp(_pack_rows_fwd, _pack_rows_bwd)


def moe_expert_parallel(x: jax.Array, params: MoEParams, plan: ExpertParallel, *,
                        return_aux: bool = False, implementation: str = "ffi"):
    """``jax_mok.moe`` partitioned over ``plan.mesh``; same results as the single-device call.

    ``x [..., H]`` with ``prod(lead dims)`` divisible by ``plan.token_shards``; expert weights
    ``[E, ...]`` with ``E`` divisible by ``plan.ep_size``. Called by :func:`jax_mok.moe`; call that.
    """
    from jax_mok import api, fp8  # api imports this module lazily; keep the cycle one-way

    config = params.config
    if config.quantization is not None:
        plan = _fp8_transport(plan, config.quantization)
    plan = _resolve_transport(plan)
    ep = plan.ep_size
    E = config.num_experts
    if E % ep:
        raise ValueError(
            f"num_experts={E} must be divisible by the size of mesh axis "
            f"{plan.expert_axis!r} ({ep}) for expert parallelism"
        )
    check_expert_weights(params, plan)
    token_axes = plan.resolved_token_axes
    shards = plan.token_shards
    lead = x.shape[:-1]
    H = config.hidden_size
    x2d = x.reshape(-1, H)
    tokens_global = x2d.shape[0]
    if tokens_global % shards:
        raise ValueError(
            f"x has {tokens_global} tokens (shape {tuple(x.shape)}), which must be divisible by "
            f"{shards} = the product of the sizes of token_axes {token_axes}"
        )
    tokens_local = tokens_global // shards
    experts_local = E // ep
    rows = _buffer_rows(config, tokens_local, tokens_global, ep)
    route_config = dataclasses.replace(config, capacity_factor=None)
    axis = plan.expert_axis
    dtype = x.dtype
    peer_workspace = None
    if plan.transport == "peer":  # run on 2 x H200 (2026-11-29; docs/peer-transport.md)
        from jax_mok import peer, workspace

        spec = workspace.WorkspaceSpec.for_call(config, tokens_local, tokens_global, ep, dtype)
        peer_workspace = workspace.workspace_for(plan.mesh, axis, spec, config)

    def local(x_loc, router, router_bias, w_gate_up, w_down, shared_gate_up, shared_down):
        routing, routed_ids = route(x_loc, router, router_bias, route_config)
        ids = routing.topk_ids
        if config.capacity_factor is not None:
            ids = _global_capacity(ids, config, token_axes, tokens_global)
        dest_of_slot, sent, row, source_token, overflow = _dispatch_indices(
            ids, ep, experts_local, rows)
        devices = jnp.arange(ep, dtype=jnp.int32)
        # Slots of buffer row (d, r): the local id where the slot goes to d, else -1.
        token_of_row = jnp.minimum(source_token, tokens_local - 1)  # padding reads token T-1
        padding = source_token >= tokens_local  # [EP, R]
        slot_dest = dest_of_slot[token_of_row]  # [EP, R, k]
        mine = (slot_dest == devices[:, None, None]) & ~padding[:, :, None]
        send_ids = jnp.where(mine, ids[token_of_row] % experts_local, DROPPED)
        # Differentiable gathers through _pack_rows: their transposes sum in a fixed order.
        pack = lambda v: _pack_rows(v, token_of_row, padding, row, sent)
        send_w = jnp.where(mine, pack(routing.topk_weights), 0.0)
        send_x = pack(x_loc)

        if peer_workspace is not None:  # one fused call when not differentiated (jax_mok.peer)
            y = peer.experts_over_peers(
                send_x, send_ids, send_w, jnp.where(sent, row, -1), source_token,
                w_gate_up.astype(dtype), w_down.astype(dtype), peer_workspace, implementation,
                config.save_activations)
        else:
            received = (jax.lax.all_to_all(a, axis, 0, 0, tiled=True)  # [EP, R, ...]
                        for a in (send_x, send_ids, send_w))
            out = _experts_on_rows(*received, fp8.cast_weight(w_gate_up, dtype),
                                   fp8.cast_weight(w_down, dtype), implementation,
                                   config.save_activations, config.quantization)
            back = jax.lax.all_to_all(out, axis, 0, 0, tiled=True)
            y = _home_sum(back, row, sent, token_of_row, padding)  # fixed order, float32
        if config.shared_size:
            y = y + api._swiglu_mlp(x_loc, shared_gate_up, shared_down)
        y = y.astype(dtype)
        if not return_aux:
            return y, None
        dropped = jnp.sum(ids < 0).astype(jnp.int32) + overflow
        kept = Routing(ids, routing.topk_weights, routing.logits, routing.scores,
                       count_per_expert(ids, config.num_experts), dropped)
        return y, aux_losses(kept, routed_ids, config, num_tokens=tokens_global,
                             reduce=lambda v: jax.lax.psum(v, token_axes))

    tokens_spec = PartitionSpec(token_axes, None)
    experts_spec = PartitionSpec(axis, None, None)
    replicated = PartitionSpec()
    aux_spec = None if not return_aux else {
        "load_balancing_loss": replicated, "router_z_loss": replicated,
        "expert_counts": replicated, "dropped_tokens": replicated,
    }
    fn = _shard_map(
        local,
        plan.mesh,
        in_specs=(tokens_spec, replicated, replicated, experts_spec, experts_spec,
                  replicated, replicated),
        out_specs=(tokens_spec, aux_spec),
    )
    args = (x2d, params.router, params.router_bias, params.w_gate_up, params.w_down,
            params.shared_gate_up, params.shared_down)
    specs = (tokens_spec, replicated, replicated, experts_spec, experts_spec, replicated,
             replicated)
    y2d, aux = fn(*(_conform(a, s, plan.mesh) for a, s in zip(args, specs, strict=True)))
    if _explicit(plan.mesh):
        # Give y the layout x had, so the reshape below is the inverse of x's (explicit axes
        # make reshapes of sharded arrays check their sharding).
        layout = jax.typeof(x2d).sharding
        if getattr(layout.mesh, "empty", True):  # x was not on the mesh: give y back whole
            layout = NamedSharding(plan.mesh, PartitionSpec()) if isinstance(
                plan.mesh, Mesh) else PartitionSpec()
        y2d = jax.sharding.reshard(y2d, layout)
    y = y2d.reshape(*lead, H)
    if return_aux:
        return y, aux
    return y


__all__ = [
    "TRANSPORTS",
    "ExpertParallel",
    "check_expert_weights",
    "expert_parallel",
    "moe_expert_parallel",
    "plan_for",
]
