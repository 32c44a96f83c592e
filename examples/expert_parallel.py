"""Expert parallelism on 8 forced CPU devices: the same layer, single-device vs on a mesh.

The experts are sharded over the mesh axis "expert", the tokens over ("data", "expert"); each
device routes its tokens, sends them to the devices owning their experts (lax.all_to_all), runs
its local experts with the jax_mok kernels and sends the results back.

    python examples/expert_parallel.py                    # EP = 1, 2, 4, 8 on 8 CPU devices
    python examples/expert_parallel.py --tokens 8192 --experts 64 --capacity-factor 1.25
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

DEVICES = 8
# Must happen before JAX starts its CPU backend.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={DEVICES}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_mok  # noqa: E402
import jax_mok.sharding  # noqa: E402
import jax_mok.testing  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=64)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--capacity-factor", type=float, default=0.0, help="0 = dropless")
    p.add_argument("--ep", type=int, nargs="*", default=[1, 2, 4, 8])
    args = p.parse_args(argv)

    devices = jax.devices()
    print(f"{len(devices)} {jax.default_backend()} devices")
    config = jax_mok.MoEConfig(num_experts=args.experts, top_k=args.top_k,
                               hidden_size=args.hidden, ffn_size=args.ffn,
                               capacity_factor=args.capacity_factor or None)
    params = jax_mok.init_params(jax.random.key(0), config, dtype=jnp.float32)
    x = jax.random.normal(jax.random.key(1), (args.tokens, args.hidden), jnp.float32)

    def loss(x, params):
        y, aux = jax_mok.moe(x, params, return_aux=True)
        return jnp.sum(y ** 2) + aux["load_balancing_loss"], (y, aux)

    step = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    (_, (y_single, aux_single)), g_single = jax.jit(step)(x, params)
    print(f"single device: dropped {int(aux_single['dropped_tokens'])} assignments")

    rel = jax_mok.testing.rel_error

    results = {}
    for ep in args.ep:
        data = len(devices) // ep
        mesh = jax.make_mesh((data, ep), ("data", "expert"), devices=devices[:data * ep])
        # Place the inputs the way a training step would: experts over "expert", tokens over all.
        experts = NamedSharding(mesh, P("expert"))
        placed = dataclasses.replace(params,
                                     w_gate_up=jax.device_put(params.w_gate_up, experts),
                                     w_down=jax.device_put(params.w_down, experts))
        xs = jax.device_put(x, NamedSharding(mesh, P(("data", "expert"))))
        with jax_mok.sharding.expert_parallel(mesh):
            fn = jax.jit(step)
            (_, (y, aux)), grads = fn(xs, placed)
            jax.block_until_ready(grads)
            start = time.perf_counter()
            jax.block_until_ready(fn(xs, placed))
            ms = (time.perf_counter() - start) * 1e3
        grad_diff = max(rel(a, b) for a, b in zip(jax.tree.leaves(grads),
                                                   jax.tree.leaves(g_single), strict=True))
        results[ep] = (rel(y, y_single), grad_diff)
        print(f"EP={ep} (mesh data={data} x expert={ep}, {args.experts // ep} experts/device): "
              f"|y - y_single|/|y_single| = {results[ep][0]:.2e}, worst gradient "
              f"{grad_diff:.2e}, dropped {int(aux['dropped_tokens'])}, "
              f"{ms:.1f} ms fwd+bwd; w_gate_up shard {grads[1].w_gate_up.sharding.spec}")
    tol = jax_mok.testing.tolerance(jnp.float32)
    worst = max(max(v) for v in results.values())
    print(f"worst difference {worst:.2e} (tolerance {tol:.0e}): {'OK' if worst < tol else 'FAIL'}")
    return results


if __name__ == "__main__":
    main()
