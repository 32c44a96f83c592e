"""The expert-parallel layer: ``jax_mok.moe`` partitioned with ``shard_map`` around the same
kernels. Per device (tokens ``x_loc [T_loc, H]``, ``E_loc = E / EP`` experts)::

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

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_mok import reference
from jax_mok.ep import pack, plan, workspace
from jax_mok.ep.peer import PeerTransport
from jax_mok.ep.transport import Transport, XlaTransport
from jax_mok.params import MoEParams
from jax_mok.quantization import cast_weight
from jax_mok.routing import Routing, aux_losses, count_per_expert, route
from jax_mok.tuning import Tuning, resolve

if hasattr(jax, "shard_map"):  # jax >= 0.7: jax.shard_map(check_vma=...)
    def shard_map(f, mesh, in_specs, out_specs):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=False)
else:  # older jax: jax.experimental.shard_map.shard_map(check_rep=...)
    from jax.experimental.shard_map import shard_map as _experimental_shard_map

    def shard_map(f, mesh, in_specs, out_specs):
        return _experimental_shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                       check_rep=False)


def _transport(ep_plan: plan.ExpertParallel, config, tokens_local: int, tokens_global: int,
               dtype, implementation: str, tuning: Tuning) -> Transport:
    """The transport object of a call; the peer workspace is created here, outside the
    ``shard_map`` (once per mesh, axis and sizes)."""
    save = config.save_activations
    if ep_plan.transport != "peer":
        return XlaTransport(ep_plan.expert_axis, implementation, save, tuning,
                            config.quantization)
    spec = workspace.WorkspaceSpec.for_call(config, tokens_local, tokens_global,
                                            ep_plan.ep_size, dtype)
    ws = workspace.workspace_for(ep_plan.mesh, ep_plan.expert_axis, spec, config,
                                 limit_bytes=tuning.peer.workspace_limit_bytes)
    return PeerTransport(ws, implementation, save, tuning)


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
    token_axes = ep_plan.resolved_token_axes
    shards = ep_plan.token_shards
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
    rows = pack.buffer_rows(config, tokens_local, tokens_global, ep)
    route_config = dataclasses.replace(config, capacity_factor=None)
    dtype = x.dtype
    transport = _transport(ep_plan, config, tokens_local, tokens_global, dtype, implementation,
                           tuning)

    def local(x_loc, router, router_bias, w_gate_up, w_down, shared_gate_up, shared_down,
              shared_gate):
        routing, routed_ids = route(x_loc, router, router_bias, route_config)
        ids = routing.topk_ids
        if config.capacity_factor is not None:
            ids = pack.global_capacity(ids, config, token_axes, tokens_global)
        packed, overflow = pack.pack(x_loc, ids, routing.topk_weights, ep, experts_local, rows)
        y = transport.experts(packed, cast_weight(w_gate_up, dtype), cast_weight(w_down, dtype))
        if config.shared_size:
            y = y + reference.swiglu_mlp(x_loc, shared_gate_up, shared_down, shared_gate)
        y = y.astype(dtype)
        if not return_aux:
            return y, None
        dropped = jnp.sum(ids < 0).astype(jnp.int32) + overflow
        kept = Routing(ids, routing.topk_weights, routing.logits, routing.scores,
                       count_per_expert(ids, config.num_experts), dropped)
        return y, aux_losses(kept, routed_ids, config, num_tokens=tokens_global,
                             reduce=lambda v: jax.lax.psum(v, token_axes))

    tokens_spec = PartitionSpec(token_axes, None)
    experts_spec = PartitionSpec(ep_plan.expert_axis, None, None)
    replicated = PartitionSpec()
    aux_spec = None if not return_aux else {
        "load_balancing_loss": replicated, "router_z_loss": replicated,
        "expert_counts": replicated, "dropped_tokens": replicated,
    }
    specs = (tokens_spec, replicated, replicated, experts_spec, experts_spec, replicated,
             replicated, replicated)
    fn = shard_map(local, ep_plan.mesh, in_specs=specs, out_specs=(tokens_spec, aux_spec))
    args = (x2d, params.router, params.router_bias, params.w_gate_up, params.w_down,
            params.shared_gate_up, params.shared_down, params.shared_gate)
    y2d, aux = fn(*(plan.conform(a, s, ep_plan.mesh) for a, s in zip(args, specs, strict=True)))
    if plan.explicit(ep_plan.mesh):
        # Give y the layout x had, so the reshape below is the inverse of x's (explicit axes
        # make reshapes of sharded arrays check their sharding).
        layout = jax.typeof(x2d).sharding
        if getattr(layout.mesh, "empty", True):  # x was not on the mesh: give y back whole
            layout = NamedSharding(ep_plan.mesh, PartitionSpec()) if isinstance(
                ep_plan.mesh, Mesh) else PartitionSpec()
        y2d = jax.sharding.reshard(y2d, layout)
    y = y2d.reshape(*lead, H)
    if return_aux:
        return y, aux
    return y


__all__ = ["moe_expert_parallel", "shard_map"]
