"""Ceilings measured in the same run: a large dense bf16 matmul and an HBM copy.

The matmul ceiling is the best of JAX (XLA/cuBLAS) and, where present, torch on the same device;
the copy bandwidth counts read + write bytes of an elementwise pass over a buffer far larger than
the L2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks import peers_torch
from benchmarks.timing import summarize, time_steps


def _jax_matmul(n: int, dtype, warmup: int, iters: int) -> dict:
    keys = jax.random.split(jax.random.key(3), 4)
    mats = [jax.random.normal(k, (n, n), jnp.float32).astype(dtype) for k in keys]
    pairs = [(mats[0], mats[1]), (mats[2], mats[3])]
    mm = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=dtype))

    def step(i: int) -> None:
        jax.block_until_ready(mm(*pairs[i % 2]))

    stats = summarize(time_steps(step, warmup=warmup, iters=iters))
    stats["tflops"] = 2 * n**3 / (stats["median_ms"] * 1e-3) / 1e12
    return stats


def _torch_matmul(n: int, warmup: int, iters: int) -> dict | None:
    if peers_torch.unavailable_reason("gpu") is not None:
        return None
    import torch

    mats = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    pairs = [(mats[0], mats[1]), (mats[2], mats[3])]

    def step(i: int) -> None:
        out = torch.mm(*pairs[i % 2])
        torch.cuda.synchronize()
        del out

    stats = summarize(time_steps(step, warmup=warmup, iters=iters))
    stats["tflops"] = 2 * n**3 / (stats["median_ms"] * 1e-3) / 1e12
    mats.clear()
    pairs.clear()
    torch.cuda.empty_cache()
    return stats


def _jax_copy(num_bytes: int, warmup: int, iters: int) -> dict:
    n = num_bytes // 4
    bufs = [jnp.arange(n, dtype=jnp.uint32) + i for i in range(2)]
    flip = jax.jit(jnp.bitwise_not)  # reads and writes every byte; cannot be elided

    def step(i: int) -> None:
        jax.block_until_ready(flip(bufs[i % 2]))

    stats = summarize(time_steps(step, warmup=warmup, iters=iters))
    stats["bytes"] = 2 * n * 4
    stats["gbps"] = stats["bytes"] / (stats["median_ms"] * 1e-3) / 1e9
    return stats


def measure(*, platform: str, quick: bool, warmup: int, iters: int) -> dict:
    """``{"matmul_tflops", "hbm_gbps", "details"}``: the ceilings for this device.

    GPU: 8192^3 bf16 matmul and a 2 GiB copy. CPU: 1024^3 (512^3 quick) and 256 MiB (64 MiB),
    enough to give the CPU numbers a scale, nothing more.
    """
    if platform == "gpu":
        n, copy_bytes = 8192, 2 * 2**30
    else:
        n, copy_bytes = (512, 64 * 2**20) if quick else (1024, 256 * 2**20)
    details = {"matmul_n": n, "jax_matmul": _jax_matmul(n, jnp.bfloat16, warmup, iters)}
    torch_mm = _torch_matmul(n, warmup, iters) if platform == "gpu" else None
    if torch_mm is not None:
        details["torch_matmul"] = torch_mm
    details["jax_copy"] = _jax_copy(copy_bytes, warmup, iters)
    best = max(d["tflops"] for k, d in details.items() if k.endswith("_matmul"))
    return {"matmul_tflops": best, "hbm_gbps": details["jax_copy"]["gbps"], "details": details}
