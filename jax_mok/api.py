"""``jax_mok.moe``: validate, route, run the routed experts, add the shared expert."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from jax_mok import _ffi, autodiff, fp8
from jax_mok.config import MoEConfig
from jax_mok.params import MoEParams
from jax_mok.routing import aux_losses, route


def _expect_shape(name: str, value, expected: tuple) -> None:
    if value is None:
        raise ValueError(f"params.{name} is None but the config needs shape {expected}")
    if tuple(value.shape) != expected:
        raise ValueError(
            f"params.{name} must have shape {expected} for this MoEConfig, got {tuple(value.shape)}"
        )


def validate(x, params) -> MoEConfig:
    """Checks ``x`` and ``params`` against ``params.config``; raises ValueError/TypeError."""
    if not isinstance(params, MoEParams):
        raise TypeError(f"params must be a jax_mok.MoEParams, got {type(params).__name__}")
    config = params.config
    if not isinstance(config, MoEConfig):
        raise TypeError(f"params.config must be a MoEConfig, got {type(config).__name__}")
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"x must be an array, got {type(x).__name__}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating-point array, got dtype {x.dtype}")
    if x.ndim < 1 or x.shape[-1] != config.hidden_size:
        raise ValueError(
            f"x must have shape [..., hidden_size={config.hidden_size}], got {tuple(x.shape)}"
        )
    E, H, F, S = config.num_experts, config.hidden_size, config.ffn_size, config.shared_size
    fp8.check_weights(params.w_gate_up, params.w_down, config.quantization)
    _expect_shape("router", params.router, (H, E))
    _expect_shape("w_gate_up", params.w_gate_up, (E, H, 2 * F))
    _expect_shape("w_down", params.w_down, (E, F, H))
    if params.router_bias is not None:
        _expect_shape("router_bias", params.router_bias, (E,))
        if config.routing != "sigmoid":
            raise ValueError(
                "params.router_bias is only used by routing='sigmoid', "
                f"but config.routing={config.routing!r}; set router_bias=None"
            )
    if S:
        _expect_shape("shared_gate_up", params.shared_gate_up, (H, 2 * S))
        _expect_shape("shared_down", params.shared_down, (S, H))
    elif params.shared_gate_up is not None or params.shared_down is not None:
        raise ValueError("params has shared-expert weights but config.num_shared_experts == 0")
    for name in ("w_gate_up", "w_down"):
        dtype = getattr(params, name).dtype
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"params.{name} must be floating point, got dtype {dtype}")
    return config


KERNEL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
CUDA_MAX_EXPERTS = 4096
_warned: set[str] = set()


def kernel_limits(dtype, config: MoEConfig, backend: str) -> str | None:
    """None when the kernels handle this call on ``backend``, else the reason they do not."""
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
    """The kernels where they are built for the default backend and handle the call (dtype and
    sizes, when given), else the reference — with a one-time warning saying why."""
    backend = jax.default_backend()
    if not _ffi.kernels_built(backend):
        return "reference"
    reason = kernel_limits(dtype, config, backend) if config is not None else None
    if reason is None:
        return "ffi"
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"jax_mok.moe: using implementation='reference' because {reason}",
                      stacklevel=3)
    return "reference"


def _swiglu_mlp(x2d, gate_up, down):
    """Dense SwiGLU MLP, f32 accumulation: [T, H] -> [T, H] float32."""
    h = jnp.dot(x2d, gate_up.astype(x2d.dtype), preferred_element_type=jnp.float32)
    S = down.shape[0]
    a = jax.nn.silu(h[:, :S]) * h[:, S:]
    return jnp.dot(a.astype(x2d.dtype), down.astype(x2d.dtype), preferred_element_type=jnp.float32)


def moe(x: jax.Array, params: MoEParams, *, return_aux: bool = False,
        implementation: str | None = None, mesh=None, expert_axis: str = "expert",
        token_axes=None, transport: str | None = None):
    """Mixture-of-Experts layer.

    Args:
      x: ``[..., H]`` float array; leading dims are flattened into T tokens.
      params: :class:`jax_mok.MoEParams` (its ``config`` fixes E, k, H, F and routing).
      return_aux: also return a dict with ``load_balancing_loss``, ``router_z_loss``,
        ``expert_counts [E] int32`` (assignments processed per expert, after capacity drops) and
        ``dropped_tokens`` (int32 count of dropped assignments).
      implementation: ``None`` (kernels if built for the default backend, else reference),
        ``"reference"``, ``"ffi"``, ``"cpu"`` or ``"cuda"``.
      mesh, expert_axis, token_axes, transport: expert parallelism (see :mod:`jax_mok.sharding`):
        with a mesh (this argument, ``jax_mok.sharding.expert_parallel``, or an ambient
        ``jax.set_mesh`` mesh having ``expert_axis``) the call runs under ``shard_map`` with the
        experts sharded over ``expert_axis`` and the tokens over ``token_axes``.

    Returns:
      ``y`` with the shape and dtype of ``x`` (and ``aux`` when ``return_aux``). Expert weights are
      cast to ``x.dtype`` for the GEMMs; accumulation is float32. With
      ``config.quantization`` the routed experts run in FP8 (:mod:`jax_mok.fp8`; the weights
      are cast to x's dtype, then quantized), and ``params`` may hold pre-quantized experts
      (:func:`jax_mok.quantize_params`, forward only).
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
    from jax_mok import sharding  # imported here: sharding uses this module's helpers

    plan = sharding.plan_for(params, mesh=mesh, expert_axis=expert_axis, token_axes=token_axes,
                             transport=transport)
    if plan is not None:
        return sharding.moe_expert_parallel(x, params, plan, return_aux=return_aux,
                                            implementation=implementation)
    lead = x.shape[:-1]
    x2d = x.reshape(-1, config.hidden_size)
    routing, routed_ids = route(x2d, params.router, params.router_bias, config)
    if config.quantization is not None:
        y = fp8.routed_experts_fp8(
            x2d, routing.topk_ids, routing.topk_weights,
            fp8.cast_weight(params.w_gate_up, x.dtype), fp8.cast_weight(params.w_down, x.dtype),
            config.quantization, implementation=implementation)
    else:
        y = autodiff.routed_experts(
            x2d,
            routing.topk_ids,
            routing.topk_weights,
            params.w_gate_up.astype(x.dtype),
            params.w_down.astype(x.dtype),
            implementation=implementation,
            save_activations=config.save_activations,
        )
    if config.shared_size:
        shared = _swiglu_mlp(x2d, params.shared_gate_up, params.shared_down)
        y = (y.astype(jnp.float32) + shared).astype(x.dtype)
    y = y.reshape(*lead, config.hidden_size)
    if return_aux:
        return y, aux_losses(routing, routed_ids, config)
    return y
