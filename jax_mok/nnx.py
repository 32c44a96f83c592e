"""``jax_mok.nnx.MoE``: the MoE layer as a Flax NNX module, a drop-in for an MLP block.

Thin over :func:`jax_mok.moe`: the module owns the weights (with logical sharding names) and
calls the op; everything else (routing, kernels, expert parallelism) is the op's.

Example:
  >>> import jax, jax.numpy as jnp, jax_mok, jax_mok.nnx
  >>> from flax import nnx
  >>> cfg = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8)
  >>> layer = jax_mok.nnx.MoE(cfg, rngs=nnx.Rngs(0))
  >>> layer.w_gate_up.shape, layer.w_down.shape
  ((4, 16, 16), (4, 8, 16))
  >>> y = layer(jnp.ones((2, 5, 16)))
  >>> y.shape, y.dtype
  ((2, 5, 16), dtype('float32'))
  >>> sorted(layer.aux.get_value())
  ['dropped_tokens', 'expert_counts', 'load_balancing_loss', 'router_z_loss']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jax_mok import api
from jax_mok.balancing import router_bias_update
from jax_mok.config import MoEConfig
from jax_mok.params import MoEParams
from jax_mok.quantization.weights import Fp8Weights
from jax_mok.quantization.weights import fp8_weights as make_fp8_weights
from jax_mok.tuning import Tuning

Dtype = Any


class RouterBias(nnx.Variable):
    """Selection bias ``[E]`` of sigmoid routing: state, not a parameter.

    Optimizers built with ``wrt=nnx.Param`` leave it alone; :func:`update_router_bias` moves it.
    """


def expert_initializer(fan_in_axis: int) -> Callable:
    """Truncated-normal, variance ``1 / fan_in``, for ``[E, in, out]`` expert weights."""
    return jax.nn.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=fan_in_axis, out_axis=-1, batch_axis=(0,))


ROUTER_INIT = jax.nn.initializers.variance_scaling(1.0, "fan_in", "normal")
DENSE_INIT = jax.nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


class MoE(nnx.Module):
    """Mixture-of-Experts SwiGLU layer ``[..., H] -> [..., H]`` (see :func:`jax_mok.moe`).

    Variables (``E`` experts, ``H`` hidden, ``F`` expert ffn, ``S`` fused shared width) and their
    logical sharding names:

    ======================  ==============  =====================  ===========================
    attribute               shape           dtype                  names
    ======================  ==============  =====================  ===========================
    ``router``              ``[H, E]``      float32                ``(embed, None)``
    ``router_bias``         ``[E]``         float32 (RouterBias)   ``(None,)``, sigmoid only
    ``w_gate_up``           ``[E, H, 2F]``  ``param_dtype``        ``(expert, embed, mlp)``
    ``w_down``              ``[E, F, H]``   ``param_dtype``        ``(expert, mlp, embed)``
    ``shared_gate_up``      ``[H, 2S]``     ``param_dtype``        ``(embed, mlp)``, if shared
    ``shared_down``         ``[S, H]``      ``param_dtype``        ``(mlp, embed)``, if shared
    ``shared_gate``         ``[H, 1]``      float32                ``(embed, None)``, if gated
    ======================  ==============  =====================  ===========================

    Args:
      config: the layer's :class:`jax_mok.MoEConfig`.
      dtype: computation dtype; ``x`` is cast to it (``None``: keep ``x.dtype``). Expert weights
        are cast to it for the GEMMs, accumulation is float32.
      param_dtype: storage dtype of the expert and shared weights (the router stays float32).
      rngs: ``nnx.Rngs`` with a ``params`` stream.
      expert_axis, embed_axis, mlp_axis: logical names put on the variables (``None``: leave
        that dim unannotated). Map them to mesh axes with your rules, or name mesh axes after them.
      eager_sharding: create variables already sharded over the ambient mesh (Flax's eager
        sharding; needs ``jax.set_mesh`` with these names as mesh axes). Default False: the
        names are metadata for ``nnx.get_partition_spec``.
      moe_fn: the op, ``moe_fn(x, params, return_aux=True) -> (y, aux)``; defaults to
        :func:`jax_mok.moe` (e.g. pass ``functools.partial(jax_mok.moe, mesh=mesh)``).
      sow_aux: keep the aux dict of the last call in ``self.aux`` (an ``nnx.Intermediate``,
        replaced on each call; drop it with ``nnx.pop(model, nnx.Intermediate)``). Turn it off
        inside ``nnx.scan`` over layers and use ``return_aux=True`` instead.
      tuning: :class:`jax_mok.Tuning` passed to every call (``moe_fn`` then gets it as
        ``tuning=``); None: the defaults and ``JAX_MOK_TUNING``.
    """

    def __init__(self, config: MoEConfig, *, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, rngs: nnx.Rngs,
                 expert_axis: str | None = "expert", embed_axis: str | None = "embed",
                 mlp_axis: str | None = "mlp", eager_sharding: bool = False,
                 moe_fn: Callable | None = None, sow_aux: bool = True,
                 tuning: Tuning | None = None):
        if not isinstance(config, MoEConfig):
            raise TypeError(f"config must be a jax_mok.MoEConfig, got {type(config).__name__}")
        if tuning is not None and not isinstance(tuning, Tuning):
            raise TypeError(f"tuning must be a jax_mok.Tuning or None, got {type(tuning).__name__}")
        self.tuning = tuning
        self.config = config
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.moe_fn = moe_fn
        self.sow_aux = sow_aux
        E, H, F, S = config.num_experts, config.hidden_size, config.ffn_size, config.shared_size

        def make(cls, init, shape, dtype, names):
            init = nnx.with_partitioning(init, names, eager_sharding=eager_sharding)
            return cls(init(rngs.params(), shape, dtype))

        self.router = make(nnx.Param, ROUTER_INIT, (H, E), jnp.float32, (embed_axis, None))
        self.router_bias = (
            RouterBias(jnp.zeros((E,), jnp.float32))
            if config.routing == "sigmoid" else None
        )
        self.w_gate_up = make(nnx.Param, expert_initializer(1), (E, H, 2 * F), param_dtype,
                              (expert_axis, embed_axis, mlp_axis))
        self.w_down = make(nnx.Param, expert_initializer(1), (E, F, H), param_dtype,
                           (expert_axis, mlp_axis, embed_axis))
        if S:
            self.shared_gate_up = make(nnx.Param, DENSE_INIT, (H, 2 * S), param_dtype,
                                       (embed_axis, mlp_axis))
            self.shared_down = make(nnx.Param, DENSE_INIT, (S, H), param_dtype,
                                    (mlp_axis, embed_axis))
        else:
            self.shared_gate_up = self.shared_down = None
        self.shared_gate = (
            make(nnx.Param, ROUTER_INIT, (H, 1), jnp.float32, (embed_axis, None))
            if config.shared_expert_gate else None
        )

    def to_params(self) -> MoEParams:
        """The current weights as :class:`jax_mok.MoEParams` (arrays, no copies)."""
        def value(v):
            return None if v is None else v.get_value()

        return MoEParams(
            router=value(self.router), router_bias=value(self.router_bias),
            w_gate_up=value(self.w_gate_up), w_down=value(self.w_down),
            shared_gate_up=value(self.shared_gate_up), shared_down=value(self.shared_down),
            config=self.config, shared_gate=value(self.shared_gate),
        )

    def fp8_weights(self, *, backward: bool = True) -> Fp8Weights:
        """The expert weights' FP8 layouts for ``config.quantization``, in the dtype the layer
        computes in (``dtype``, else the parameters'): :func:`jax_mok.fp8_weights` of
        :meth:`to_params`. Make them once per optimizer step and pass them to every call of the
        step (``module(x, fp8_weights=w)``); remake them after the parameters change."""
        dtype = self.dtype if self.dtype is not None else self.param_dtype
        return make_fp8_weights(self.to_params(), dtype=dtype, backward=backward)

    def __call__(self, x: jax.Array, *, return_aux: bool = False,
                 fp8_weights: Fp8Weights | None = None):
        """``x [..., H]`` -> ``y [..., H]`` in ``dtype`` (or x's); ``(y, aux)`` if return_aux.
        ``fp8_weights``: this layer's :meth:`fp8_weights`, made earlier in the step (FP8 only)."""
        if self.dtype is not None:
            x = x.astype(self.dtype)
        fn = self.moe_fn if self.moe_fn is not None else api.moe
        extra = {} if self.tuning is None else {"tuning": self.tuning}
        if fp8_weights is not None:
            extra["fp8_weights"] = fp8_weights
        y, aux = fn(x, self.to_params(), return_aux=True, **extra)
        if self.sow_aux:
            self.aux = nnx.Intermediate(aux)
        return (y, aux) if return_aux else y


def update_router_bias(model: nnx.Module, expert_counts: jax.Array | None = None, *,
                       rate: float = 1e-3) -> None:
    """Aux-loss-free balancing step for every sigmoid :class:`MoE` in ``model``, in place.

    ``router_bias += rate * sign(mean(load) - load)``, see
    :func:`jax_mok.balancing.router_bias_update`.
    ``expert_counts``: the load ``[E]`` (or ``[L, E]`` for ``L`` layers stacked by ``nnx.vmap`` /
    ``nnx.scan``, matching their ``router_bias [L, E]``). ``None`` reads each layer's
    ``self.aux["expert_counts"]`` from its last call (``sow_aux=True``).
    """
    found = False
    for _, module in nnx.iter_graph(model):
        if not isinstance(module, MoE) or module.router_bias is None:
            continue
        found = True
        counts = expert_counts
        if counts is None:
            sown = getattr(module, "aux", None)
            if sown is None:
                raise ValueError(
                    "update_router_bias: expert_counts=None but the layer has no sown aux; call "
                    "it with sow_aux=True first or pass expert_counts"
                )
            counts = sown.get_value()["expert_counts"]
        bias = module.router_bias.get_value()
        if tuple(counts.shape[-bias.ndim:]) != tuple(bias.shape):
            raise ValueError(
                f"update_router_bias: expert_counts has shape {tuple(counts.shape)}, expected "
                f"{tuple(bias.shape)} (one count per expert{' per layer' if bias.ndim > 1 else ''})"
            )
        # A bias stacked by nnx.vmap / nnx.scan ([L, E]) is balanced per layer on its own load.
        module.router_bias.set_value(router_bias_update(bias, counts, rate))
    if not found:
        raise ValueError("update_router_bias: model has no jax_mok.nnx.MoE with routing='sigmoid'")


__all__ = ["MoE", "RouterBias", "update_router_bias"]
