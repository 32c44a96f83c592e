"""The partitioned layer: ``jax_mok.moe`` under ``shard_map`` around the same kernels, for a
plan whose mesh is known at trace time (:mod:`jax_mok.ep.discover`).

Data parallel (``plan.expert_axis is None``, experts replicated): each device routes its tokens
and runs the local kernels on them; only the aux statistics (and the capacity counts) are summed
over the token axes. Expert parallel, per device (tokens ``x_loc [T_loc, H]``, ``E_loc = E / EP``
experts)::

    route x_loc (replicated router)          -> ids [T_loc, k], weights [T_loc, k]
    capacity (optional, global semantics)    -> ids past an expert's capacity become -1
    pack: each token once per destination device, with its slots for that device
          (ids rebased to the destination's local experts, other slots -1, weight 0)
                                             -> x [EP, R, H], ids [EP, R, k], weights [EP, R, k]
    transport.experts: the rows travel to their experts' device, the local kernels run on them
          (padding rows, all ids -1, skipped), the results come home and are summed per token
          in a fixed order (destination 0..EP-1, float32)
                                             -> y [T_loc, H]
    + the shared expert (replicated), cast to x's dtype

``R`` is static (:func:`jax_mok.ep.pack.buffer_rows`). The capacity keeps the single-device
meaning (``C = ceil(capacity_factor * T * k / E)`` over the global ``T``, earliest tokens
first): devices exchange their per-expert counts (``E`` integers) to rank their assignments
globally, so EP and single-device calls drop the same assignments. The result, the aux values
and the gradients equal the single-device call's up to float summation order.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from jax_mok import reference
from jax_mok.ep import meshes, pack, plan, workspace
from jax_mok.ep.peer import PeerTransport
from jax_mok.ep.transport import Transport, XlaTransport
from jax_mok.kernels import autodiff, vma
from jax_mok.params import MoEParams
from jax_mok.quantization import cast_weight
from jax_mok.quantization import cuda as fp8
from jax_mok.routing import Routing, aux_losses, count_per_expert, route
from jax_mok.tuning import Tuning, resolve
from jax_mok.warn import warn_once

if hasattr(jax, "shard_map"):  # jax >= 0.7: jax.shard_map(check_vma=..., axis_names=...)
    def shard_map(f, mesh, in_specs, out_specs):
        """``shard_map`` over the free axes of ``mesh`` (inside a user's ``shard_map`` its
        manual axes are already split: the layer nests over the others)."""
        kwargs = {}
        if meshes.manual_axes(mesh):
            kwargs["axis_names"] = set(meshes.free_axes(mesh))
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=False, **kwargs)
else:  # older jax: jax.experimental.shard_map.shard_map(check_rep=...)
    from jax.experimental.shard_map import shard_map as _experimental_shard_map

    def shard_map(f, mesh, in_specs, out_specs):
        return _experimental_shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                       check_rep=False)


def no_tokens(x: jax.Array, config, return_aux: bool):
    """The layer on ``T = 0`` tokens: ``y`` (x's shape, zero-size) and the aux of no tokens
    (losses 0, counts 0), as the single-device layer gives them."""
    # Computed from x (empty, so no value to mind): a jit whose outputs are all constants runs
    # on one device, which x's explicit-axis type would refuse.
    y = x * jnp.zeros((), x.dtype)
    if not return_aux:
        return y
    zero = jnp.zeros((), jnp.float32)
    return y, {"load_balancing_loss": zero, "router_z_loss": zero,
               "expert_counts": jnp.zeros((config.num_experts,), jnp.int32),
               "dropped_tokens": jnp.zeros((), jnp.int32)}


def _transport(ep_plan: plan.ExpertParallel, config, tokens_local: int, tokens_global: int,
               dtype, implementation: str, tuning: Tuning) -> Transport | None:
    """The transport object of a call (None when data parallel: nothing travels); the peer
    workspace is created here, outside the ``shard_map`` (once per mesh, axis and sizes)."""
    save = config.save_activations
    if ep_plan.expert_axis is None:
        return None
    weight_grads = config.weight_gradient_mode(expert_parallel=True)
    if config.quantization is not None and weight_grads == "unquantized":
        # Rows reach the experts as deq(Q(x)) (the XLA transport quantizes what travels), so
        # "unquantized" weight gradients would not be the single-device layer's.
        raise NotImplementedError(
            "jax_mok: fp8_weight_gradients='unquantized' has no expert-parallel path yet (the "
            "token rows travel quantized); use 'fp8' (or None) with an expert axis")
    if config.quantization is not None and config.fp8_weight_gradients is None:
        message = ("jax_mok: MoEConfig(fp8_weight_gradients=None) runs 'fp8' weight gradients "
                   "under expert parallelism (the token rows travel quantized, so 'unquantized' "
                   "has no path here) and 'unquantized' on one device or data parallel; set "
                   "fp8_weight_gradients='fp8' to get the same gradients on every mesh")
        warn_once(message, message, stacklevel=3)
    if ep_plan.transport != "peer":
        return XlaTransport(ep_plan.expert_axis, implementation, save, tuning,
                            config.quantization, weight_grads)
    spec = workspace.WorkspaceSpec.for_call(config, tokens_local, tokens_global,
                                            ep_plan.ep_size, dtype)
    ws = workspace.workspace_for(ep_plan.mesh, ep_plan.expert_axis, spec, config,
                                 limit_bytes=tuning.peer.workspace_limit_bytes)
    return PeerTransport(ws, implementation, save, tuning, config.quantization, weight_grads)


def moe_expert_parallel(x: jax.Array, params: MoEParams, ep_plan: plan.ExpertParallel, *,
                        return_aux: bool = False, implementation: str = "ffi",
                        tuning: Tuning | None = None):
    """``jax_mok.moe`` partitioned over ``ep_plan.mesh``; same results as the single-device call.

    ``x [..., H]`` with ``prod(lead dims)`` divisible by ``ep_plan.token_shards``; expert weights
    ``[E, ...]`` with ``E`` divisible by ``ep_plan.ep_size``. Called by :func:`jax_mok.moe`; call
    that.
    """
    config = params.config
    tuning = resolve(tuning)
    ep_plan = plan.resolve_transport(ep_plan, config.quantization)
    ep = ep_plan.ep_size
    E = config.num_experts
    if E % ep:
        raise ValueError(
            f"num_experts={E} must be divisible by the size of mesh axis "
            f"{ep_plan.expert_axis!r} ({ep}) for expert parallelism"
        )
    plan.check_expert_weights(params, ep_plan)
    mesh = ep_plan.mesh
    token_axes = ep_plan.resolved_token_axes
    shards = ep_plan.token_shards
    tokens_global = math.prod(x.shape[:-1])
    if tokens_global % shards:
        raise ValueError(
            f"x has {tokens_global} tokens (shape {tuple(x.shape)}), which must be divisible by "
            f"{shards} = the product of the sizes of token_axes {token_axes}"
        )
    if tokens_global == 0:
        return no_tokens(x, config, return_aux)
    x2d = _flatten(x, mesh, token_axes)
    tokens_local = tokens_global // shards
    experts_local = E // ep
    rows = pack.buffer_rows(config, tokens_local, tokens_global, ep)
    # One shard of tokens: route() applies the capacity itself; else its global ranking below.
    global_capacity = config.capacity_factor is not None and shards > 1
    route_config = dataclasses.replace(config, capacity_factor=None) if global_capacity else config
    dtype = x.dtype
    transport = _transport(ep_plan, config, tokens_local, tokens_global, dtype, implementation,
                           tuning)

    def reduce(v):
        return jax.lax.psum(v, token_axes) if token_axes else v

    def local(x_loc, router, router_bias, w_gate_up, w_down, shared_gate_up, shared_down,
              shared_gate):
        routing, routed_ids = route(x_loc, router, router_bias, route_config)
        ids = routing.topk_ids
        if global_capacity:
            ids = pack.global_capacity(ids, config, token_axes, tokens_global)
        if transport is None:  # data parallel: this device's tokens, every expert here
            overflow = jnp.zeros((), jnp.int32)
            w_gu, w_dn = cast_weight(w_gate_up, dtype), cast_weight(w_down, dtype)
            if config.quantization is not None:
                y = fp8.routed_experts_fp8(
                    x_loc, ids, routing.topk_weights, w_gu, w_dn, config.quantization,
                    implementation=implementation, save_activations=config.save_activations,
                    weight_grads=config.weight_gradient_mode()).astype(jnp.float32)
            else:
                y = autodiff.routed_experts(
                    x_loc, ids, routing.topk_weights, w_gu, w_dn,
                    implementation=implementation, save_activations=config.save_activations,
                    tuning=tuning).astype(jnp.float32)
        else:
            packed, overflow = pack.pack(x_loc, ids, routing.topk_weights, ep, experts_local,
                                         rows)
            y = transport.experts(packed, cast_weight(w_gate_up, dtype),
                                  cast_weight(w_down, dtype))
        if config.shared_size:
            y = y + reference.swiglu_mlp(x_loc, shared_gate_up, shared_down, shared_gate)
        y = y.astype(dtype)
        if not return_aux:
            return y, None
        dropped = jnp.sum(ids < 0).astype(jnp.int32) + overflow
        kept = Routing(ids, routing.topk_weights, routing.logits, routing.scores,
                       count_per_expert(ids, config.num_experts), dropped)
        return y, aux_losses(kept, routed_ids, config, num_tokens=tokens_global, reduce=reduce)

    tokens_spec = PartitionSpec(token_axes or None, None)
    experts_spec = PartitionSpec(ep_plan.expert_axis, None, None)
    replicated = PartitionSpec()
    aux_spec = None if not return_aux else {
        "load_balancing_loss": replicated, "router_z_loss": replicated,
        "expert_counts": replicated, "dropped_tokens": replicated,
    }
    specs = (tokens_spec, replicated, replicated, experts_spec, experts_spec, replicated,
             replicated, replicated)
    fn = shard_map(local, mesh, in_specs=specs, out_specs=(tokens_spec, aux_spec))
    if meshes.manual_axes(mesh) and vma.axes(x2d):
        fn = _not_differentiable_here(fn)
    args = (x2d, params.router, params.router_bias, params.w_gate_up, params.w_down,
            params.shared_gate_up, params.shared_down, params.shared_gate)
    y2d, aux = fn(*(plan.conform(a, s, mesh) for a, s in zip(args, specs, strict=True)))
    y = _unflatten(y2d, x, mesh)
    if return_aux:
        return y, aux
    return y


def _not_differentiable_here(fn):
    """``fn`` (a ``shard_map`` nested in a user's ``shard_map`` that checks vma types) with a
    backward that says why there is none: JAX (0.10) cannot transpose a ``shard_map`` nested
    in one with ``check_vma=True`` (unchecked inner map: a cotangent type error; checked: an
    MLIR verifier error), so the gradient would fail inside JAX with neither message."""

    @jax.custom_vjp
    def forward_only(*args):
        return fn(*args)

    def fwd(*args):
        return fn(*args), None

    def bwd(_, cotangents):
        raise NotImplementedError(
            "jax_mok.moe: differentiating an expert-parallel call nested in a shard_map with "
            "check_vma=True is not supported by JAX (it cannot transpose the nested shard_map); "
            "pass check_vma=False to your shard_map, include the expert axis in it (the layer "
            "then runs per shard), or call jax_mok.moe outside it")

    forward_only.defvjp(fwd, bwd)
    return forward_only


def _on_mesh(x, mesh) -> bool:
    """Whether x's type carries ``mesh``'s (explicit) axes."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    found = getattr(sharding, "mesh", None)
    return (found is not None and not getattr(found, "empty", True)
            and tuple(found.axis_names) == tuple(mesh.axis_names))


def _flatten(x: jax.Array, mesh, token_axes: tuple[str, ...]) -> jax.Array:
    """``x [..., H] -> [T, H]``. With explicit axes a reshape must say where its result lives
    (the merge of sharded token dims may move tokens): there, straight to the token layout."""
    H = x.shape[-1]
    if not meshes.explicit(mesh) or not _on_mesh(x, mesh):
        return x.reshape(-1, H)
    return jnp.reshape(x, (-1, H), out_sharding=NamedSharding(mesh, PartitionSpec(
        token_axes or None, None)))


def _unflatten(y2d: jax.Array, x: jax.Array, mesh) -> jax.Array:
    """``y [T, H] -> x.shape`` in x's layout (explicit axes: x's own sharding, or replicated
    when x was not on the mesh)."""
    if not meshes.explicit(mesh):
        return y2d.reshape(x.shape)
    layout = (jax.typeof(x).sharding if _on_mesh(x, mesh)
              else NamedSharding(mesh, PartitionSpec()))
    return jnp.reshape(y2d, x.shape, out_sharding=layout)


__all__ = ["moe_expert_parallel", "no_tokens", "shard_map"]
