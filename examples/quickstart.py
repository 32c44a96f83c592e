"""jax_mok in one page: config -> params -> jax_mok.moe under jit -> gradients.

    python examples/quickstart.py                    # small layer, a few seconds on a CPU
    python examples/quickstart.py --tokens 4096 --hidden 1024 --ffn 512 --experts 32 --top-k 4
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

import jax_mok
import jax_mok.testing


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=64)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = p.parse_args(argv)
    dtype = jnp.dtype(args.dtype)

    # 1. A layer is described by a frozen MoEConfig ...
    config = jax_mok.MoEConfig(num_experts=args.experts, top_k=args.top_k,
                               hidden_size=args.hidden, ffn_size=args.ffn)
    # 2. ... and its weights are a MoEParams pytree.
    params = jax_mok.init_params(jax.random.key(0), config, dtype=dtype)
    x = jax.random.normal(jax.random.key(1), (args.tokens, args.hidden)).astype(dtype)
    print(f"config: {config}")
    print(f"x {x.shape} {x.dtype}; w_gate_up {params.w_gate_up.shape}, "
          f"w_down {params.w_down.shape}; backend {jax.default_backend()}")

    # 3. The layer: y has x's shape and dtype; aux has the router losses and expert loads.
    layer = jax.jit(lambda x, params: jax_mok.moe(x, params, return_aux=True))
    y, aux = layer(x, params)
    print(f"y {y.shape} {y.dtype}; tokens per expert {aux['expert_counts'].tolist()}; "
          f"load-balancing loss {float(aux['load_balancing_loss']):.4f}")

    # 4. Same layer, pure-JAX reference (the oracle): the kernels agree with it.
    y_ref = jax.jit(lambda x, p: jax_mok.moe(x, p, implementation="reference"))(x, params)
    diff = jax_mok.testing.rel_error(y, y_ref)
    print(f"kernels vs reference: relative difference {diff:.2e}")

    # 5. Gradients flow to x, the router and the experts (custom_vjp around the FFI kernels).
    def loss(x, params):
        y, aux = jax_mok.moe(x, params, return_aux=True)
        return jnp.mean(y.astype(jnp.float32) ** 2) + 0.01 * aux["load_balancing_loss"]

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    dx, dparams = grad(x, params)
    start = time.perf_counter()
    jax.block_until_ready(grad(x, params))
    print(f"grad: |dx| {float(jnp.linalg.norm(dx.astype(jnp.float32))):.4f}, "
          f"|d router| {float(jnp.linalg.norm(dparams.router)):.4f}, "
          f"|d w_gate_up| {float(jnp.linalg.norm(dparams.w_gate_up.astype(jnp.float32))):.4f} "
          f"({(time.perf_counter() - start) * 1e3:.1f} ms per forward+backward)")
    return {"relative_difference": diff}


if __name__ == "__main__":
    main()
