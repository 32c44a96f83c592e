"""``jax_mok.linen.MoE``: the MoE layer as a Flax Linen module (thin over :func:`jax_mok.moe`).

Collections: ``params`` (router, expert and shared weights, logically partitioned),
``router_bias`` (sigmoid routing's selection bias: state, not trained; update it with
:func:`update_router_bias`), and ``intermediates`` (the sown aux dict of each call).

Example:
  >>> import jax, jax.numpy as jnp, jax_mok, jax_mok.linen
  >>> cfg = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8,
  ...                         routing="sigmoid")
  >>> layer = jax_mok.linen.MoE(cfg)
  >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 5, 16)))
  >>> sorted(variables), variables["params"]["w_gate_up"].value.shape
  (['params', 'router_bias'], (4, 16, 16))
  >>> y, state = layer.apply(variables, jnp.ones((2, 5, 16)), mutable=["intermediates"])
  >>> y.shape, state["intermediates"]["aux"][0]["expert_counts"].shape
  ((2, 5, 16), (4,))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jax_mok import api
from jax_mok.balancing import router_bias_update
from jax_mok.config import MoEConfig
from jax_mok.nnx import DENSE_INIT, ROUTER_INIT, expert_initializer
from jax_mok.params import MoEParams
from jax_mok.quantization.weights import Fp8Weights
from jax_mok.quantization.weights import fp8_weights as make_fp8_weights
from jax_mok.tuning import Tuning

Dtype = Any
BIAS_COLLECTION = "router_bias"


class MoE(nn.Module):
    """Mixture-of-Experts SwiGLU layer ``[..., H] -> [..., H]`` (see :func:`jax_mok.moe`).

    Same variables, shapes and logical names as :class:`jax_mok.nnx.MoE`: ``router [H, E]``
    (embed, None), ``w_gate_up [E, H, 2F]`` (expert, embed, mlp), ``w_down [E, F, H]`` (expert,
    mlp, embed), ``shared_gate_up [H, 2S]`` / ``shared_down [S, H]``, ``shared_gate [H, 1]``
    (embed, None) when ``config.shared_expert_gate``; ``router_bias [E]`` lives in
    the ``"router_bias"`` collection.

    Attributes:
      config: the layer's :class:`jax_mok.MoEConfig`.
      dtype: computation dtype (``None``: x's). param_dtype: storage of expert/shared weights.
      expert_axis, embed_axis, mlp_axis: logical names (``nn.with_logical_partitioning``).
      moe_fn: the op, ``moe_fn(x, params, return_aux=True) -> (y, aux)``; default
        :func:`jax_mok.moe`.
      sow_aux: ``self.sow("intermediates", "aux", aux)`` on each call.
      tuning: :class:`jax_mok.Tuning` passed to every call (``moe_fn`` then gets it as
        ``tuning=``); None: the defaults and ``JAX_MOK_TUNING``.
    """

    config: MoEConfig
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    expert_axis: str | None = "expert"
    embed_axis: str | None = "embed"
    mlp_axis: str | None = "mlp"
    moe_fn: Callable | None = None
    sow_aux: bool = True
    tuning: Tuning | None = None

    @nn.compact
    def __call__(self, x: jax.Array, *, return_aux: bool = False,
                 fp8_weights: Fp8Weights | None = None):
        """``x [..., H]`` -> ``y [..., H]``; ``(y, aux)`` when ``return_aux``. ``fp8_weights``
        (FP8 configs): this layer's :func:`fp8_weights`, made once per optimizer step."""
        config = self.config
        if not isinstance(config, MoEConfig):
            raise TypeError(f"config must be a jax_mok.MoEConfig, got {type(config).__name__}")
        E, H, F, S = config.num_experts, config.hidden_size, config.ffn_size, config.shared_size
        ex, em, ml = self.expert_axis, self.embed_axis, self.mlp_axis

        def param(name, init, shape, dtype, names):
            return self.param(name, nn.with_logical_partitioning(init, names), shape, dtype)

        router = param("router", ROUTER_INIT, (H, E), jnp.float32, (em, None))
        w_gate_up = param("w_gate_up", expert_initializer(1), (E, H, 2 * F), self.param_dtype,
                          (ex, em, ml))
        w_down = param("w_down", expert_initializer(1), (E, F, H), self.param_dtype,
                       (ex, ml, em))
        shared_gate_up = shared_down = None
        if S:
            shared_gate_up = param("shared_gate_up", DENSE_INIT, (H, 2 * S), self.param_dtype,
                                   (em, ml))
            shared_down = param("shared_down", DENSE_INIT, (S, H), self.param_dtype, (ml, em))
        shared_gate = None
        if config.shared_expert_gate:
            shared_gate = param("shared_gate", ROUTER_INIT, (H, 1), jnp.float32, (em, None))
        router_bias = None
        if config.routing == "sigmoid":
            router_bias = self.variable(BIAS_COLLECTION, "bias", jnp.zeros, (E,), jnp.float32).value
        params = MoEParams(router, router_bias, w_gate_up, w_down, shared_gate_up, shared_down,
                           config, shared_gate)
        if self.dtype is not None:
            x = x.astype(self.dtype)
        if self.tuning is not None and not isinstance(self.tuning, Tuning):
            raise TypeError(
                f"tuning must be a jax_mok.Tuning or None, got {type(self.tuning).__name__}")
        fn = self.moe_fn if self.moe_fn is not None else api.moe
        extra = {} if self.tuning is None else {"tuning": self.tuning}
        if fp8_weights is not None:
            extra["fp8_weights"] = fp8_weights
        y, aux = fn(x, params, return_aux=True, **extra)
        if self.sow_aux:
            self.sow("intermediates", "aux", aux)
        return (y, aux) if return_aux else y


def update_router_bias(variables: Mapping, expert_counts: jax.Array | Mapping,
                       *, rate: float = 1e-3) -> dict:
    """Aux-loss-free balancing on the ``"router_bias"`` collection; returns new variables.

    ``expert_counts``: one load array for every bias in the collection (``[E]``, or ``[L, E]``
    matching a bias stacked by ``nn.scan``), or a mapping shaped like the collection (e.g. built
    from the sown ``intermediates``). ``bias += rate * sign(mean(load) - load)``.
    """
    if BIAS_COLLECTION not in variables:
        raise ValueError(
            f"update_router_bias: variables have no {BIAS_COLLECTION!r} collection "
            f"(collections: {sorted(variables)}); it exists only for routing='sigmoid'"
        )

    def one(bias, counts):  # a bias stacked by nn.scan ([L, E]) is balanced per layer
        return router_bias_update(bias, counts, rate)

    biases = variables[BIAS_COLLECTION]
    if isinstance(expert_counts, Mapping):
        new = jax.tree.map(one, biases, expert_counts)
    else:
        new = jax.tree.map(lambda b: one(b, expert_counts), biases)
    return {**variables, BIAS_COLLECTION: new}


def fp8_weights(params: Mapping, config: MoEConfig, *, dtype, backward: bool = True
                ) -> Fp8Weights:
    """:func:`jax_mok.fp8_weights` of one :class:`MoE` layer's ``params`` subtree (the mapping
    holding its ``w_gate_up`` and ``w_down``; stacked layers of ``nn.scan``: ``jax.vmap`` this).
    ``dtype``: the layer's compute dtype (its ``dtype``, else the parameters'). Pass the result
    as ``module.apply(variables, x, fp8_weights=w)``; remake it after the parameters change."""
    missing = [name for name in ("w_gate_up", "w_down") if name not in params]
    if missing:
        raise KeyError(f"jax_mok.linen.fp8_weights: params has no {missing} (pass the MoE "
                       f"layer's own subtree, e.g. variables['params']['moe']); got keys "
                       f"{sorted(params)}")
    params = nn.unbox(params)  # init's variables hold LogicallyPartitioned boxes
    experts = MoEParams(params.get("router"), None, params["w_gate_up"], params["w_down"],
                        None, None, config, None)
    return make_fp8_weights(experts, dtype=dtype, backward=backward)


__all__ = ["BIAS_COLLECTION", "MoE", "fp8_weights", "update_router_bias"]
