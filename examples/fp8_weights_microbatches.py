"""FP8 expert weights quantized once per optimizer step, reused by every micro-batch and layer.

    python examples/fp8_weights_microbatches.py                  # a few seconds on a CPU
    python examples/fp8_weights_microbatches.py --recipe mxfp8 --micro-batches 8 --layers 4

A stack of MoE layers (parameters stacked along a leading layer axis, run with ``lax.scan``)
trained with gradient accumulation over micro-batches (another ``lax.scan``). With
``MoEConfig(quantization=...)`` every call of the layer would quantize its expert weights —
``layers x micro-batches`` times per step. Instead each step makes the FP8 layouts once,
``jax_mok.fp8_weights`` (``jax.vmap``-ed over the layer axis), and passes them to every call
with ``jax_mok.moe(x, params, fp8_weights=w)``: the same values and gradients (checked below
against the step that quantizes in every call), with the quantization paid once.

``w`` is a cache of the parameters: it is made from the step's parameters before the
micro-batches, and after the optimizer update it is stale until the next step remakes it.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jax_mok


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", choices=jax_mok.quantization.RECIPES, default="fp8_block")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64, help="tokens per micro-batch")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)

    config = jax_mok.MoEConfig(num_experts=args.experts, top_k=args.top_k,
                               hidden_size=args.hidden, ffn_size=args.ffn,
                               quantization=args.recipe)
    keys = jax.random.split(jax.random.key(0), args.layers)
    # float32 master weights stacked over layers; the layers compute in bfloat16.
    params = jax.vmap(lambda k: jax_mok.init_params(k, config, jnp.float32))(keys)
    batch = jax.random.normal(jax.random.key(1), (args.micro_batches, args.tokens, args.hidden),
                              jnp.bfloat16)

    def loss(params, x, w):
        """The layer stack on one micro-batch: lax.scan over the layers (residual blocks)."""
        def block(h, layer):
            p_l, w_l = layer
            y = jax_mok.moe(h, p_l, fp8_weights=w_l)
            return (h.astype(jnp.float32) + y.astype(jnp.float32)).astype(jnp.bfloat16), None

        h, _ = jax.lax.scan(block, x, (params, w))
        return jnp.mean(h.astype(jnp.float32) ** 2)

    def gradient(params, batch, prepared: bool):
        """The step's gradient, accumulated over the micro-batches (lax.scan)."""
        w = None
        if prepared:  # once per optimizer step, for every layer
            w = jax.vmap(functools.partial(jax_mok.fp8_weights, dtype=jnp.bfloat16))(params)

        def micro(acc, x):
            value, g = jax.value_and_grad(loss)(params, x, w)
            return (acc[0] + value, jax.tree.map(jnp.add, acc[1], g)), None

        zeros = (jnp.float32(0), jax.tree.map(jnp.zeros_like, params))
        (total, grads), _ = jax.lax.scan(micro, zeros, batch)
        n = batch.shape[0]
        return total / n, jax.tree.map(lambda g: g / n, grads)

    optimizer = optax.adamw(1e-3)

    @functools.partial(jax.jit, static_argnames="prepared")
    def step(params, opt_state, batch, prepared: bool = True):
        value, grads = gradient(params, batch, prepared)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    # The prepared gradient equals the one that quantizes in every call (up to the order in
    # which the micro-batches' float32 sums are taken).
    g_prepared = jax.jit(functools.partial(gradient, prepared=True))(params, batch)
    g_plain = jax.jit(functools.partial(gradient, prepared=False))(params, batch)
    difference = max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
                     for a, b in zip(jax.tree.leaves(g_prepared), jax.tree.leaves(g_plain),
                                     strict=True))
    print(f"{args.recipe}: {args.layers} layers x {args.micro_batches} micro-batches; "
          f"max relative gradient difference, prepared vs quantized in every call: "
          f"{difference:.2e}")

    opt_state = optimizer.init(params)
    losses = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        params, opt_state, value = step(params, opt_state, batch)
        value = float(value)
        losses.append(value)
        print(f"step {i}: loss {value:.5f} ({time.perf_counter() - t0:.2f} s)")
    return {"gradient_difference": difference, "losses": losses,
            "finite": bool(np.all(np.isfinite(losses)))}


if __name__ == "__main__":
    main()
