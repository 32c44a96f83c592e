"""``jax_mok.moe``: validate, choose the implementation, find the plan, then run the partitioned
layer (:mod:`jax_mok.ep.layer`, a ``shard_map``: data, expert or data x expert parallel) or the
single-device layer (:func:`jax_mok.reference.layer`) whose routed experts partition themselves
when XLA spreads the call over several devices (:mod:`jax_mok.ep.partitioned`)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from jax_mok import ep, reference
from jax_mok.config import MoEConfig
from jax_mok.kernels import _ffi, autodiff
from jax_mok.params import MoEParams, validate
from jax_mok.quantization import cuda as fp8
from jax_mok.quantization.weights import Fp8Weights, check_fp8_weights
from jax_mok.tuning import Tuning, resolve
from jax_mok.warn import warn_once

KERNEL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
CUDA_MAX_EXPERTS = 4096


def kernel_limits(dtype, config: MoEConfig, backend: str) -> str | None:
    """None when the kernels handle this call on ``backend``, else the reason they do not (on
    a GPU first the device: the CUDA kernels run on compute capability 9.x only)."""
    if backend in ("gpu", "cuda") and (reason := _ffi.cuda_device_limits()) is not None:
        return reason
    if jnp.dtype(dtype) not in KERNEL_DTYPES:
        return f"the kernels take float32 or bfloat16 x, got {jnp.dtype(dtype)}"
    if backend in ("gpu", "cuda"):
        H, F, E = config.hidden_size, config.ffn_size, config.num_experts
        if H % 8 or F % 8:
            return ("the CUDA kernels need hidden_size and ffn_size multiples of 8, "
                    f"got H={H}, F={F}")
        if E > CUDA_MAX_EXPERTS:
            return f"the CUDA kernels take at most {CUDA_MAX_EXPERTS} experts per call, got {E}"
    return None


def default_implementation(dtype=None, config: MoEConfig | None = None) -> str:
    """The kernels where they are built for the default backend, run on its device (on a GPU:
    compute capability 9.x) and handle the call (dtype and sizes, when given), else the
    reference — with a one-time warning saying why."""
    backend = jax.default_backend()
    if not _ffi.kernels_built(backend):
        return "reference"
    if config is not None:
        reason = kernel_limits(dtype, config, backend)
    else:
        reason = _ffi.cuda_device_limits() if backend in ("gpu", "cuda") else None
    if reason is None:
        return "ffi"
    warn_once(("api", reason), f"jax_mok.moe: using implementation='reference' because {reason} "
              "(pass implementation='reference' to silence this warning)", stacklevel=3)
    return "reference"


def moe(x: jax.Array, params: MoEParams, *, return_aux: bool = False,
        implementation: str | None = None, mesh=None, expert_axis: str = "expert",
        token_axes=None, transport: str | None = None, tuning: Tuning | None = None,
        fp8_weights: Fp8Weights | None = None):
    """Mixture-of-Experts layer.

    Args:
      x: ``[..., H]`` float array; leading dims are flattened into T tokens.
      params: :class:`jax_mok.MoEParams` (its ``config`` fixes E, k, H, F and routing).
      return_aux: also return a dict with ``load_balancing_loss``, ``router_z_loss``,
        ``expert_counts [E] int32`` (assignments processed per expert, after capacity drops) and
        ``dropped_tokens`` (int32 count of dropped assignments).
      implementation: ``None`` (kernels if built for the default backend and, on a GPU, it has
        compute capability 9.x; else reference), ``"reference"``, ``"ffi"``, ``"cpu"`` or
        ``"cuda"`` (these three raise at trace time where the kernels cannot run the call).
      mesh, expert_axis, token_axes, transport: the partitioning (see :mod:`jax_mok.sharding`).
        Without any of them the call reads the shardings of ``x`` and the expert weights: under
        ``jax.jit`` it runs data parallel where the experts are replicated, expert parallel
        where they are sharded along ``E`` (data x expert with sharded tokens), output sharded
        like ``x``; never gathering experts. With a mesh (this argument,
        ``jax_mok.sharding.expert_parallel``, or an ambient ``jax.set_mesh`` mesh having
        ``expert_axis``) the call runs under ``shard_map`` with the experts sharded over
        ``expert_axis`` and the tokens over ``token_axes``.
      tuning: :class:`jax_mok.Tuning` for the kernels and the peer transport (None: the
        defaults and ``JAX_MOK_TUNING``; jax_mok/tuning.py). Never changes what is computed.
      fp8_weights: with ``config.quantization``, the expert weights' FP8 layouts made once by
        :func:`jax_mok.fp8_weights` (e.g. per optimizer step, for every micro-batch): the call
        reads them instead of quantizing ``params``' weights. Values and gradients (which still
        reach ``params``) are those of the call without it, for the weights it was made from;
        it is a cache the caller keeps current. Not with a mesh plan (``mesh=``, sharded
        experts); inside a user's ``shard_map``, pass per-device fp8_weights.

    Returns:
      ``y`` with the shape and dtype of ``x`` (and ``aux`` when ``return_aux``). Expert weights are
      cast to ``x.dtype`` for the GEMMs; accumulation is float32. With ``config.quantization``
      the routed experts run in FP8 (:mod:`jax_mok.quantization.layer` states the semantics;
      the weights are cast to x's dtype, then quantized), and ``params`` may hold
      pre-quantized experts (:func:`jax_mok.quantize_params`, forward only).
    """
    config = validate(x, params)
    if implementation is None:
        implementation = default_implementation(x.dtype, config)
    elif implementation not in autodiff.IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be None or one of {autodiff.IMPLEMENTATIONS}, "
            f"got {implementation!r}"
        )
    elif implementation != "reference":
        backend = {"cuda": "gpu", "cpu": "cpu"}.get(implementation, jax.default_backend())
        reason = kernel_limits(x.dtype, config, backend)
        if reason is not None:
            raise ValueError(f"implementation={implementation!r}: {reason}; "
                             "use implementation='reference' or None")
    tuning = resolve(tuning)
    if fp8_weights is not None:
        check_fp8_weights(fp8_weights, config, x.dtype)
    plan = ep.plan_for(params, x=x, mesh=mesh, expert_axis=expert_axis, token_axes=token_axes,
                       transport=transport)
    if plan is not None:
        if fp8_weights is not None:
            kind = ("expert parallel over " + repr(plan.expert_axis) if plan.expert_axis
                    else "data parallel")
            raise NotImplementedError(
                f"jax_mok.moe: fp8_weights with a mesh plan ({kind}) are not supported; leave "
                "them out (the layer then quantizes its local experts in each call), or call "
                "the layer inside your own shard_map with per-device fp8_weights")
        if not _traced(x, params):
            # Eagerly, the shard_map below would run op by op and compile every op of the layer
            # again on each call (~200 programs); jitted once per plan and options instead.
            return _jitted_expert_parallel(plan, return_aux, implementation, tuning)(x, params)
        return ep.moe_expert_parallel(x, params, plan, return_aux=return_aux,
                                      implementation=implementation, tuning=tuning)
    if math.prod(x.shape[:-1]) == 0:
        return ep.no_tokens(x, config, return_aux)
    if config.quantization is not None:  # the FP8 layer (quantization.layer states its semantics)
        manual = ep.meshes.manual_axes(ep.meshes.ambient_mesh())
        if not manual and ep.partitioned.on_several_devices(x, params.w_gate_up, params.w_down):
            raise NotImplementedError(
                f"jax_mok: quantization={config.quantization!r} with arrays on a mesh of several "
                "devices needs the layout at trace time: pass mesh=..., use jax.set_mesh, or "
                "explicit axes (the automatically partitioned ops run the BF16 layer only)")
        experts = functools.partial(fp8.routed_experts_fp8, recipe=config.quantization,
                                    implementation=implementation,
                                    save_activations=config.save_activations,
                                    prepared=fp8_weights,
                                    weight_grads=config.weight_gradient_mode())
    elif _partitioned_experts(x, params, implementation):
        experts = functools.partial(ep.partitioned.routed_experts, config=config,
                                    implementation=implementation, tuning=tuning)
    else:
        experts = functools.partial(autodiff.routed_experts, implementation=implementation,
                                    save_activations=config.save_activations, tuning=tuning)
    return reference.layer(x, params, experts, return_aux=return_aux)


def _traced(*trees) -> bool:
    """Whether any array leaf of ``trees`` is a tracer (the call is being traced by jit, grad,
    vmap or a shard_map), as opposed to an eager call on concrete arrays."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(trees))


@functools.lru_cache(maxsize=32)
def _jitted_expert_parallel(plan, return_aux: bool, implementation: str, tuning: Tuning):
    """:func:`jax_mok.ep.moe_expert_parallel` for eager calls: one jitted function per plan and
    options (all hashable: frozen dataclasses and a mesh), whose compiled programs jit caches by
    the arguments' shapes and shardings."""
    return jax.jit(functools.partial(ep.moe_expert_parallel, ep_plan=plan,
                                     return_aux=return_aux, implementation=implementation,
                                     tuning=tuning))


def _partitioned_experts(x, params: MoEParams, implementation: str) -> bool:
    """Whether the routed experts are :mod:`jax_mok.ep.partitioned`'s ops (which lower to the
    plain call on one device): not inside a ``shard_map`` (the call then runs on its shard);
    for the kernels wherever the process has several devices (XLA would otherwise run a custom
    call on gathered operands); for the reference only where the arrays live on a mesh of
    several devices (elsewhere XLA partitions it like any JAX code, and its backward keeps
    autodiff's residuals)."""
    if ep.meshes.manual_axes(ep.meshes.ambient_mesh()):
        return False
    if ep.partitioned.on_several_devices(x, params.w_gate_up, params.w_down):
        return True
    return implementation != "reference" and jax.device_count() > 1


__all__ = ["default_implementation", "kernel_limits", "moe", "validate"]
