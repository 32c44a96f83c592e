"""The routed experts as ops that partition themselves when XLA partitions the program.

Under ``jax.jit`` with auto axes, a traced array's type does not say how it is sharded: the
layer cannot choose a ``shard_map`` at trace time. These ops are
``jax.experimental.custom_partitioning`` calls: their global meaning is the single-device one
(the local kernels on all tokens and experts), and their ``partition`` callback runs once XLA's
partitioner (Shardy or GSPMD) has chosen the operands' layouts:

- experts replicated: **data parallel**, each device runs the local kernels on its own token
  rows (the weight gradients are summed over the token axes);
- experts sharded along ``E`` over one mesh axis: **expert parallel**, the XLA transport
  (:mod:`jax_mok.ep.pack`, ``all_to_all``) inside the op; tokens replicated over that axis are
  split among its devices and gathered back;
- any other expert layout raises a ValueError naming the layout to use: the experts are never
  gathered.

Routing, the shared expert and the aux values stay plain JAX around these ops (XLA partitions
them over the tokens). On one device ``custom_partitioning`` lowers to its global function.

Why ``custom_partitioning`` (not a ``shard_map`` chosen at trace time): it is the one public
mechanism of jax 0.10 and 0.11 that hands a function the operands' shardings chosen by the
partitioner, with collectives allowed in the per-shard function. What it cannot do: change its
outputs' global shapes per layout, so the residuals between forward and backward are fixed
before the layout is known. Data parallel keeps the single-device residual policy (``h``
``[T*k, 2F]`` row-sharded like the tokens); expert parallel computes ``h`` where the experts
are, so its backward re-dispatches the rows and recomputes ``h`` (the ``h`` output is then an
unused placeholder), and it uses transport ``"xla"``. A plan known at trace time
(:mod:`jax_mok.ep.discover`: ``mesh=``, the context, explicit axes, ``jax.set_mesh``) avoids
both costs; the op warns once when it falls back to them.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from jax_mok import reference
from jax_mok.config import MoEConfig
from jax_mok.ep import meshes, pack, plan, workspace
from jax_mok.ep.transport import XlaTransport
from jax_mok.kernels import autodiff, targets
from jax_mok.tuning import Tuning, resolve

_WARNED: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Call:
    """What the ops of one call need to know statically (hashable: the key of their cache)."""

    config: MoEConfig
    implementation: str
    save: bool
    tuning: Tuning


# ------------------------------------------------------------------ per-device functions

def _forward(call: Call, x, ids, w, gu, dn):
    if call.implementation == "reference":
        return reference.routed_experts(x, ids, w, gu, dn)
    return targets.moe_forward(call.tuning.kernel)(x, ids, w, gu, dn)


def _forward_train(call: Call, x, ids, w, gu, dn):
    return autodiff.forward_keeping_h(call.tuning.kernel, x, ids, w, gu, dn)


def _backward(call: Call, dy, x, ids, w, gu, dn, h=None):
    """``(dx, d_weights, d_w_gate_up, d_w_down)`` of the local experts on these rows."""
    if call.implementation == "reference":
        _, vjp = jax.vjp(lambda x, w, gu, dn: reference.routed_experts(x, ids, w, gu, dn),
                         x, w, gu, dn)
        return vjp(dy)
    if h is None:
        return targets.moe_backward(call.tuning.kernel)(dy, x, ids, w, gu, dn)
    return autodiff.backward_with_h(call.tuning.kernel, dy, x, ids, w, gu, dn, h)


def _exchange_forward(call: Call, axis: str, ep: int, tokens_global: int, x, ids, w, gu, dn):
    """Expert parallel on one device: its rows to their experts' devices over ``axis`` and
    back, summed per token (``y [T_loc, H]`` in x's dtype; ``gu``, ``dn`` its local experts)."""
    experts_local = call.config.num_experts // ep
    rows = pack.buffer_rows(call.config, x.shape[0], tokens_global, ep)
    packed, _ = pack.pack(x, ids, w, ep, experts_local, rows)
    transport = XlaTransport(axis, call.implementation, False, call.tuning)
    return transport.experts(packed, gu, dn).astype(x.dtype)


# ------------------------------------------------------------------ layouts

class Layout(NamedTuple):
    """How the partitioner laid out one call's operands, as the op serves them.

    ``token_axes``: the mesh axes of the token rows (major to minor); ``expert_axis``: the axis
    of the experts' ``E`` dim, or None (replicated); ``split``: the tokens are replicated over
    ``expert_axis``, so each of its devices takes a slice of them (and gives it back)."""

    mesh: jax.sharding.Mesh
    token_axes: tuple[str, ...]
    expert_axis: str | None
    split: bool

    def spec(self, ndim: int, lead=None) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec(lead, *(None,) * (ndim - 1)))

    @property
    def tokens(self) -> NamedSharding:
        return self.spec(2, self.token_axes or None)

    @property
    def experts(self) -> NamedSharding:
        return self.spec(3, self.expert_axis)

    @property
    def ep(self) -> int:
        return 1 if self.expert_axis is None else int(self.mesh.shape[self.expert_axis])


def _spec(sharding, ndim: int, what: str) -> tuple:
    if not isinstance(sharding, NamedSharding):
        raise ValueError(
            f"jax_mok.moe: the partitioner gave {what} a sharding without a mesh "
            f"({sharding}); run the call under jax.jit with NamedSharding-placed inputs, or "
            "inside jax.set_mesh(mesh)")
    spec = tuple(sharding.spec)
    return spec + (None,) * (ndim - len(spec))


def layout(call: Call, mesh, x, gu, dn) -> Layout:
    """The :class:`Layout` of a call from its operands' shapes and shardings (x ``[T, H]``,
    ``gu [E, H, 2F]``, ``dn [E, F, H]``); ValueError for expert layouts that would need the
    experts gathered, or that the tokens cannot be split for."""
    expert_axis = plan.weights_expert_axis(
        {name: _spec(arg.sharding, 3, name) for name, arg in (("params.w_gate_up", gu),
                                                                ("params.w_down", dn))})
    tokens = x.shape[0]
    token_axes: tuple[str, ...] = ()
    for a in meshes.spec_axes(_spec(x.sharding, 2, "x")[0]):
        # The longest prefix of x's token axes that splits the rows evenly.
        if tokens % (meshes.size(mesh, token_axes) * int(mesh.shape[a])):
            break
        token_axes = (*token_axes, a)
    split = expert_axis is not None and expert_axis not in token_axes
    lay = Layout(mesh, token_axes, expert_axis, split)
    E = call.config.num_experts
    if E % lay.ep:
        raise ValueError(
            f"jax_mok.moe: num_experts={E} must be divisible by the size of mesh axis "
            f"{expert_axis!r} ({lay.ep}) that the expert weights are sharded over")
    local = tokens // meshes.size(mesh, token_axes)
    if split and local % lay.ep:
        raise ValueError(
            f"jax_mok.moe: the experts are sharded over {expert_axis!r} ({lay.ep} devices) but "
            f"the tokens are not, and the {local} tokens per device do not split into "
            f"{lay.ep}: shard x's tokens over {expert_axis!r} too, e.g. "
            f"PartitionSpec(({', '.join(repr(a) for a in (*token_axes, expert_axis))}), None)")
    if expert_axis is not None:
        _warn_expert_parallel_costs(call, mesh, expert_axis)
    return lay


def _warn_expert_parallel_costs(call: Call, mesh, axis: str) -> None:
    reasons = []
    if call.save:
        reasons.append("recomputes the gate/up GEMM in the backward (saved activations need "
                       "the layout at trace time)")
    if (plan.default_transport() != "xla" and int(mesh.shape[axis]) > 1
            and workspace.peer_transport_available(mesh, axis)[0]):
        reasons.append("uses transport 'xla', not 'peer'")
    if not reasons:
        return
    message = (f"jax_mok.moe: expert parallelism found at compile time (auto axes) "
               f"{' and '.join(reasons)}; give the layout at trace time to avoid "
               f"{'this' if len(reasons) == 1 else 'both'}: jax.set_mesh(mesh), explicit mesh "
               "axes, or mesh=...")
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=2)


def _take(lay: Layout, *arrays):
    """Each device's slice of rows replicated over the expert axis (``lay.split``)."""
    if not lay.split:
        return arrays
    i = jax.lax.axis_index(lay.expert_axis)
    n = arrays[0].shape[0] // lay.ep
    return tuple(jax.lax.dynamic_slice_in_dim(a, i * n, n, 0) for a in arrays)


def _give_back(lay: Layout, *arrays):
    if not lay.split:
        return arrays
    return tuple(jax.lax.all_gather(a, lay.expert_axis, axis=0, tiled=True) for a in arrays)


def _sum_weight_grads(lay: Layout, dgu, dn_grad):
    """Weight gradients summed over the token axes the experts are not sharded over (the
    devices along the expert axis hold different experts: their gradients are not summed)."""
    axes = tuple(a for a in lay.token_axes if a != lay.expert_axis)
    if not axes:
        return dgu, dn_grad
    return jax.lax.psum(dgu, axes), jax.lax.psum(dn_grad, axes)


# ------------------------------------------------------------------ the ops

def _partition_forward(call: Call, train: bool):
    def partition(mesh, arg_shapes, result_shape):
        x, _, _, gu, dn = arg_shapes
        lay = layout(call, mesh, x, gu, dn)
        tokens_global = x.shape[0]
        k = arg_shapes[1].shape[1]

        def lower(x, ids, w, gu, dn):
            if lay.expert_axis is None:
                if train:
                    return _forward_train(call, x, ids, w, gu, dn)
                return _forward(call, x, ids, w, gu, dn)
            rows = x.shape[0]
            x, ids, w = _take(lay, x, ids, w)
            y = _exchange_forward(call, lay.expert_axis, lay.ep, tokens_global, x, ids, w,
                                  gu, dn)
            (y,) = _give_back(lay, y)
            if train:  # h is computed where the experts are: the backward recomputes it
                return y, jnp.zeros((rows * k, gu.shape[-1]), x.dtype)
            return y

        results = _shaped_like(result_shape, (lay.tokens, lay.tokens) if train else (lay.tokens,))
        args = (lay.tokens, lay.tokens, lay.tokens, lay.experts, lay.experts)
        return mesh, lower, results, args

    return partition


def _partition_backward(call: Call, saved: bool):
    def partition(mesh, arg_shapes, result_shape):
        _, x, _, _, gu, dn = arg_shapes[:6]
        lay = layout(call, mesh, x, gu, dn)
        tokens_global = x.shape[0]

        def lower(dy, x, ids, w, gu, dn, *h):
            if lay.expert_axis is None:
                dx, dw, dgu, ddn = _backward(call, dy, x, ids, w, gu, dn, *h)
                return (dx, dw, *_sum_weight_grads(lay, dgu, ddn))
            dy, x, ids, w = _take(lay, dy, x, ids, w)

            def forward(x, w, gu, dn):
                return _exchange_forward(call, lay.expert_axis, lay.ep, tokens_global, x, ids,
                                         w, gu, dn)

            _, vjp = jax.vjp(forward, x, w, gu, dn)
            dx, dw, dgu, ddn = vjp(dy)
            dx, dw = _give_back(lay, dx, dw)
            return (dx, dw, *_sum_weight_grads(lay, dgu, ddn))

        results = _shaped_like(result_shape, (lay.tokens, lay.tokens, lay.experts, lay.experts))
        args = (lay.tokens,) * 4 + (lay.experts,) * 2 + ((lay.tokens,) if saved else ())
        return mesh, lower, results, args

    return partition


def _shaped_like(result_shape, shardings: tuple):
    """``shardings`` (one per result, in order) in the pytree structure of the op's results."""
    leaves, tree = jax.tree.flatten(result_shape)
    if len(leaves) != len(shardings):
        raise AssertionError(f"{len(leaves)} results, {len(shardings)} shardings")
    return jax.tree.unflatten(tree, list(shardings))


def _infer_tokens(arg: int, outputs: tuple[str, ...]):
    """GSPMD's result shardings (Shardy uses the rule strings): rows like ``x``'s, experts like
    the weights'."""
    def infer(mesh, arg_shapes, result_shape):
        x = arg_shapes[arg].sharding
        axes = meshes.spec_axes(_spec(x, 2, "x")[0])
        tokens = NamedSharding(mesh, PartitionSpec(axes or None, None))
        like = {"t": tokens, "w": arg_shapes[arg + 3].sharding, "d": arg_shapes[arg + 4].sharding}
        return _shaped_like(result_shape, tuple(like[o] for o in outputs))
    return infer


_OPERANDS = "t h, t k, t k, e i f, e g j"
_WEIGHT_GRADS = "e i f, e g j"


@functools.cache
def ops(call: Call):
    """``(forward, forward_train, backward, backward_saved)`` of ``call``: forward ``(x, ids, w,
    gu, dn) -> y``; forward_train ``-> (y, h [T*k, 2F])``; backward ``(dy, x, ids, w, gu, dn)``
    and backward_saved ``(..., h)`` ``-> (dx, d_w, d_gu, d_dn)``."""
    def global_forward(x, ids, w, gu, dn):
        return _forward(call, x, ids, w, gu, dn)

    def global_forward_train(x, ids, w, gu, dn):
        return _forward_train(call, x, ids, w, gu, dn)

    def global_backward(dy, x, ids, w, gu, dn):
        return _backward(call, dy, x, ids, w, gu, dn)

    def global_backward_saved(dy, x, ids, w, gu, dn, h):
        return _backward(call, dy, x, ids, w, gu, dn, h)

    built = []
    for fn, partition, infer, rule in (
        (global_forward, _partition_forward(call, False), _infer_tokens(0, "t"),
         f"{_OPERANDS} -> t h"),
        (global_forward_train, _partition_forward(call, True), _infer_tokens(0, "tt"),
         f"{_OPERANDS} -> t h, (t k) f"),
        (global_backward, _partition_backward(call, False), _infer_tokens(1, "ttwd"),
         f"t h, {_OPERANDS} -> t h, t k, {_WEIGHT_GRADS}"),
        (global_backward_saved, _partition_backward(call, True), _infer_tokens(1, "ttwd"),
         f"t h, {_OPERANDS}, (t k) f -> t h, t k, {_WEIGHT_GRADS}"),
    ):
        op = custom_partitioning(fn)
        op.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule)
        built.append(op)
    forward, forward_train, backward, backward_saved = built
    return (_foldable(forward), _unbatchable(forward_train), _unbatchable(backward),
            _unbatchable(backward_saved))


def _unbatchable(op):
    """``op`` with a batching rule that says why there is none: per-example weight gradients
    would need one call per example (as for the local kernels, jax_mok/kernels/targets.py)."""
    wrapped = jax.custom_batching.custom_vmap(op)
    wrapped.def_vmap(targets.no_vmap_of_gradients)
    return wrapped


def _foldable(op):
    """``op`` under ``jax.vmap`` of x (and its routing): the batch folded into the rows, one
    call (custom_partitioning has no batching rule of its own)."""
    wrapped = jax.custom_batching.custom_vmap(op)

    @wrapped.def_vmap
    def _(axis_size, in_batched, x, ids, w, gu, dn):
        if in_batched[3] or in_batched[4]:
            raise NotImplementedError(
                "jax_mok: vmap over the expert weights (w_gate_up / w_down) is not supported; "
                "only x (and its routing) may be batched")

        def fold(a, batched):
            a = a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))
            return a.reshape(-1, *a.shape[2:])

        y = wrapped(fold(x, in_batched[0]), fold(ids, in_batched[1]), fold(w, in_batched[2]),
                    gu, dn)
        return y.reshape(axis_size, x.shape[-2], -1), True

    return wrapped


# ------------------------------------------------------------------ the custom_vjp

@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _experts(x, ids, w, gu, dn, call: Call):
    return ops(call)[0](x, ids, w, gu, dn)


def _experts_fwd(x, ids, w, gu, dn, call):
    forward, forward_train, _, _ = ops(call)
    if call.save:
        y, h = forward_train(x, ids, w, gu, dn)
    else:
        y, h = forward(x, ids, w, gu, dn), None
    return y, (x, ids, w, gu, dn, h)


def _experts_bwd(call, residuals, dy):
    x, ids, w, gu, dn, h = residuals
    _, _, backward, backward_saved = ops(call)
    operands = (dy.astype(x.dtype), x, ids, w, gu, dn)
    grads = backward(*operands) if h is None else backward_saved(*operands, h)
    dx, dw, dgu, ddn = grads
    return dx, None, dw, dgu, ddn


_experts.defvjp(_experts_fwd, _experts_bwd)


def routed_experts(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array,
                   w_gate_up: jax.Array, w_down: jax.Array, *, config: MoEConfig,
                   implementation: str = "ffi", tuning: Tuning | None = None) -> jax.Array:
    """:func:`jax_mok.kernels.autodiff.routed_experts` (same operands, same result ``y [T, H]``
    in x's dtype) as ops partitioned by the layout XLA gives them (module docstring).

    ``config``: the layer's :class:`jax_mok.MoEConfig` (E, capacity, ``save_activations``);
    ``implementation``: ``"reference"`` (pure JAX per device) or a kernel implementation.
    """
    if implementation == "reference":
        save = False
    else:
        autodiff.check_implementation(implementation)
        save = autodiff.resolve_save_activations(implementation, config.save_activations)
    call = Call(config, implementation, save, resolve(tuning))
    return _experts(x2d, topk_ids, topk_weights, w_gate_up, w_down, call)


def on_several_devices(*arrays) -> bool:
    """Whether one of ``arrays`` lives on a mesh of several devices (placed there, or traced with
    a type that carries such a mesh: auto axes say the mesh, not the layout)."""
    return any(meshes.traced_mesh(a) is not None for a in arrays)


__all__ = ["Call", "Layout", "layout", "on_several_devices", "ops", "routed_experts"]
