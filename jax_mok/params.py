"""MoEParams: the weights of one MoE layer as a pytree, init_params, and validate (a call's x
and params against params.config)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jax_mok.config import MoEConfig
from jax_mok.quantization import check_weights


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MoEParams:
    """Weights of a MoE layer. ``config`` is static pytree metadata.

    Shapes: ``router [H, E]`` float32, ``router_bias [E]`` float32 or None (sigmoid routing),
    ``w_gate_up [E, H, 2F]`` (gate = ``[..., :F]``, up = ``[..., F:]``), ``w_down [E, F, H]``,
    ``shared_gate_up [H, 2S]`` / ``shared_down [S, H]`` or None, ``shared_gate [H, 1]`` float32
    (``config.shared_expert_gate``) or None. ``shared_gate`` comes last with a default so that
    positional construction without it keeps working.
    """

    router: jax.Array
    router_bias: jax.Array | None
    w_gate_up: jax.Array
    w_down: jax.Array
    shared_gate_up: jax.Array | None
    shared_down: jax.Array | None
    config: MoEConfig = dataclasses.field(metadata=dict(static=True))
    shared_gate: jax.Array | None = None


def init_params(key: jax.Array, config: MoEConfig, dtype=jnp.bfloat16) -> MoEParams:
    """Random initial weights: truncated-normal fan-in scaling, router in float32.

    Example:
      >>> import jax, jax_mok
      >>> cfg = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8)
      >>> p = jax_mok.init_params(jax.random.key(0), cfg)
      >>> p.w_gate_up.shape, p.w_down.shape
      ((4, 16, 16), (4, 8, 16))
    """
    if not isinstance(config, MoEConfig):
        raise TypeError(f"init_params: config must be a MoEConfig, got {type(config).__name__}")
    E, H, F = config.num_experts, config.hidden_size, config.ffn_size
    S = config.shared_size
    k_router, k_gu, k_down, k_sgu, k_sdown = jax.random.split(key, 5)
    # Its own stream: turning the gate on leaves every other weight unchanged.
    k_sgate = jax.random.fold_in(key, 5)

    def fan_in(k, shape, fan):
        # Drawn in the target dtype: a float32 temporary of S4's w_gate_up alone would be 67 GB.
        std = jnp.asarray(1.0 / math.sqrt(fan), dtype)
        return jax.random.truncated_normal(k, -2.0, 2.0, shape, dtype) * std

    router = jax.random.normal(k_router, (H, E), jnp.float32) / math.sqrt(H)
    router_bias = jnp.zeros((E,), jnp.float32) if config.routing == "sigmoid" else None
    shared_gate_up = fan_in(k_sgu, (H, 2 * S), H) if S else None
    shared_down = fan_in(k_sdown, (S, H), S) if S else None
    shared_gate = (jax.random.normal(k_sgate, (H, 1), jnp.float32) / math.sqrt(H)
                   if config.shared_expert_gate else None)
    return MoEParams(
        router=router,
        router_bias=router_bias,
        w_gate_up=fan_in(k_gu, (E, H, 2 * F), H),
        w_down=fan_in(k_down, (E, F, H), F),
        shared_gate_up=shared_gate_up,
        shared_down=shared_down,
        config=config,
        shared_gate=shared_gate,
    )


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
    check_weights(params.w_gate_up, params.w_down, config.quantization)
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
    if config.shared_expert_gate:
        _expect_shape("shared_gate", params.shared_gate, (H, 1))
    elif params.shared_gate is not None:
        raise ValueError("params.shared_gate is set but config.shared_expert_gate is False; "
                         "set shared_expert_gate=True or shared_gate=None")
    for name in ("w_gate_up", "w_down"):
        dtype = getattr(params, name).dtype
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"params.{name} must be floating point, got dtype {dtype}")
    return config
