"""Aux-loss-free load balancing (DeepSeek-V3): nudge the sigmoid router's selection bias.

With ``routing="sigmoid"`` experts are *selected* by ``sigmoid(logits) + router_bias`` but
*weighted* by ``sigmoid(logits)`` alone, so the bias steers load without entering the gradient.
After each step, an overloaded expert's bias goes down and an underloaded one's goes up::

    router_bias += rate * sign(mean(load) - load)

``load`` is the per-expert assignment count of the step (``aux["expert_counts"]``), summed over
layers' micro-batches as you like. The update is not a gradient step: keep ``router_bias`` out of
the optimizer (the Flax modules store it in a non-trainable variable / collection).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def router_bias_update(router_bias: jax.Array, expert_counts: jax.Array,
                       rate: float = 1e-3) -> jax.Array:
    """New bias ``[E] float32``: ``router_bias + rate * sign(mean(load) - load)``.

    Args:
      router_bias: ``[E]`` current bias (any float dtype; the result keeps it), or ``[L, E]``
        for L stacked layers (nn.scan / nnx.vmap), each balanced on its own load.
      expert_counts: assignments per expert in the last step, shaped like ``router_bias`` or
        with extra leading dims (summed, e.g. microbatches).
      rate: step size ``u`` (DeepSeek-V3 uses 1e-3).

    Example:
      >>> import jax.numpy as jnp
      >>> router_bias_update(jnp.zeros(4), jnp.array([10, 2, 4, 0]), rate=0.5)
      Array([-0.5,  0.5,  0. ,  0.5], dtype=float32)
    """
    if router_bias.ndim < 1 or (
        tuple(expert_counts.shape[expert_counts.ndim - router_bias.ndim:])
        != tuple(router_bias.shape)
    ):
        raise ValueError(
            f"expert_counts must end in router_bias's shape {tuple(router_bias.shape)} (one count "
            f"per expert{' per layer' if router_bias.ndim > 1 else ''}), got "
            f"{tuple(expert_counts.shape)}"
        )
    load = expert_counts.astype(jnp.float32)
    extra = load.ndim - router_bias.ndim
    if extra > 0:
        load = load.sum(tuple(range(extra)))
    delta = rate * jnp.sign(load.mean(-1, keepdims=True) - load)
    return (router_bias.astype(jnp.float32) + delta).astype(router_bias.dtype)


__all__ = ["router_bias_update"]
