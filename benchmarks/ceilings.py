"""Ceilings measured in the same run: large dense matmuls (bf16 and FP8) and an HBM copy.

Each matmul ceiling is the best of JAX (XLA) and, where present, torch on the same device: bf16
``jnp.dot`` / ``torch.mm``; FP8 ``jnp.dot`` of E4M3 operands and ``torch._scaled_mm`` of E4M3
operands with float32 row-wise scales (one per row of A, one per column of B; fast
accumulation, bf16 output). The copy bandwidth counts read + write bytes of an elementwise pass
over a buffer far larger than the L2, and is likewise the best of an XLA pass and, where
present, a torch pass (each call timed on the host with its synchronization: a measure whose
per-call overhead is larger reads as a slower memory system, and the roofline's memory term must
not be taken from it). Inputs are random normal (never zeros) and alternate between two pairs
so that no call reads what the previous one left in the L2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks import peers_torch
from benchmarks.timing import summarize, time_steps


def _stats_tflops(step, n: int, warmup: int, iters: int) -> dict:
    stats = summarize(time_steps(step, warmup=warmup, iters=iters))
    stats["tflops"] = 2 * n**3 / (stats["median_ms"] * 1e-3) / 1e12
    return stats


def _jax_matmul(n: int, dtype, warmup: int, iters: int, out_dtype=None) -> dict:
    """``n x n @ n x n`` in ``dtype`` (bf16, or float8_e4m3fn with a bf16 result)."""
    keys = jax.random.split(jax.random.key(3), 4)
    mats = [jax.random.normal(k, (n, n), jnp.float32).astype(dtype) for k in keys]
    pairs = [(mats[0], mats[1]), (mats[2], mats[3])]
    out_dtype = out_dtype or dtype
    mm = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=out_dtype))

    def step(i: int) -> None:
        jax.block_until_ready(mm(*pairs[i % 2]))

    return _stats_tflops(step, n, warmup, iters)


def _torch_available() -> bool:
    return peers_torch.unavailable_reason("gpu") is None


def _torch_matmul(n: int, warmup: int, iters: int) -> dict | None:
    if not _torch_available():
        return None
    import torch

    mats = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    pairs = [(mats[0], mats[1]), (mats[2], mats[3])]

    def step(i: int) -> None:
        out = torch.mm(*pairs[i % 2])
        torch.cuda.synchronize()
        del out

    stats = _stats_tflops(step, n, warmup, iters)
    mats.clear()
    pairs.clear()
    torch.cuda.empty_cache()
    return stats


def _torch_fp8_matmul(n: int, warmup: int, iters: int) -> dict:
    """``torch._scaled_mm`` on E4M3 ``n x n`` operands: A row-major, B column-major (what the
    FP8 tensor cores read), float32 scales per row of A and per column of B, bf16 out."""
    import torch

    f8 = torch.float8_e4m3fn
    pairs = []
    for _ in range(2):
        a = torch.randn(n, n, device="cuda").to(f8)
        b = torch.randn(n, n, device="cuda").to(f8).t()  # column-major view
        scale_a = torch.rand(n, 1, device="cuda") + 0.5
        scale_b = torch.rand(1, n, device="cuda") + 0.5
        pairs.append((a, b, scale_a, scale_b))

    def step(i: int) -> None:
        a, b, sa, sb = pairs[i % 2]
        out = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
        torch.cuda.synchronize()
        del out

    stats = _stats_tflops(step, n, warmup, iters)
    stats["settings"] = "row-wise float32 scales, use_fast_accum=True, bf16 out"
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


def _torch_copy(num_bytes: int, warmup: int, iters: int) -> dict | None:
    """One ``torch.bitwise_not`` pass from one buffer into another (read + write)."""
    if not _torch_available():
        return None
    import torch

    n = num_bytes // 4
    bufs = [torch.arange(n, device="cuda", dtype=torch.int32) + i for i in range(2)]
    bufs.append(torch.empty(n, device="cuda", dtype=torch.int32))  # the destination

    def step(i: int) -> None:
        torch.bitwise_not(bufs[i % 2], out=bufs[2])
        torch.cuda.synchronize()

    stats = summarize(time_steps(step, warmup=warmup, iters=iters))
    stats["bytes"] = 2 * n * 4
    stats["gbps"] = stats["bytes"] / (stats["median_ms"] * 1e-3) / 1e9
    bufs.clear()
    torch.cuda.empty_cache()
    return stats


def _copies(details: dict, num_bytes: int, warmup: int, iters: int, gpu: bool) -> str:
    """Runs the copy measures into ``details`` (the torch one through :func:`_attempt`, on a
    GPU); returns the name of the fastest."""
    details["jax_copy"] = _jax_copy(num_bytes, warmup, iters)
    if gpu:
        _attempt(details, "torch_copy", _torch_copy, num_bytes, warmup, iters)
    timed = {name: details[name]["gbps"] for name in ("jax_copy", "torch_copy") if name in details}
    return max(timed, key=timed.get)


def copy_ceiling(num_bytes: int = 2 << 30, warmup: int = 3, iters: int = 20) -> dict:
    """``{"gbps", "source", "bytes"}``: the best copy measure on the default device, as in
    :func:`measure` (tools/kernel_timings.py prints the quantizers against it)."""
    details: dict = {}
    source = _copies(details, num_bytes, warmup, iters, jax.default_backend() == "gpu")
    return {"gbps": details[source]["gbps"], "source": source, "bytes": num_bytes}


def _attempt(details: dict, name: str, fn, *args) -> None:
    """Runs one measurement into ``details[name]``; a failure is recorded under
    ``details[name + "_error"]`` (an FP8 path a device or library lacks must not cost the run
    its other ceilings)."""
    try:
        result = fn(*args)
    except Exception as error:  # noqa: BLE001 - recorded, the other ceilings still count
        details[name + "_error"] = f"{type(error).__name__}: {str(error)[:300]}"
        return
    if result is not None:
        details[name] = result


def _matmuls(details: dict, precision: str, n: int, warmup: int, iters: int,
             gpu: bool) -> str | None:
    """Runs the dense ``n^3`` matmuls of ``precision`` into ``details`` (:func:`_attempt`): XLA,
    and on a GPU torch where present. Returns the name of the fastest that ran, or None."""
    if precision == "bf16":
        runs = {"jax_matmul": (_jax_matmul, n, jnp.bfloat16, warmup, iters)}
        if gpu:
            runs["torch_matmul"] = (_torch_matmul, n, warmup, iters)
    elif precision == "fp8":
        runs = {"jax_fp8_matmul": (_jax_matmul, n, jnp.float8_e4m3fn, warmup, iters,
                                   jnp.bfloat16)}
        if gpu and _torch_available():
            runs["torch_fp8_matmul"] = (_torch_fp8_matmul, n, warmup, iters)
    else:
        raise ValueError(f"precision must be 'bf16' or 'fp8', got {precision!r}")
    for name, (fn, *args) in runs.items():
        _attempt(details, name, fn, *args)
    timed = {name: details[name]["tflops"] for name in runs if name in details}
    return max(timed, key=timed.get) if timed else None


def matmul_ceiling(precision: str, n: int = 8192, warmup: int = 3, iters: int = 20) -> dict:
    """``{"tflops", "source", "n"}``: the best dense ``n^3`` matmul of ``precision`` ("bf16" or
    "fp8") on the default device, XLA and (on a GPU, where present) torch, as in
    :func:`measure`; tools/kernel_timings.py prints its rows against it."""
    details: dict = {}
    source = _matmuls(details, precision, n, warmup, iters, jax.default_backend() == "gpu")
    if source is None:
        raise RuntimeError(f"no {precision} matmul ran: {details}")
    return {"tflops": details[source]["tflops"], "source": source, "n": n}


def measure(*, platform: str, quick: bool, warmup: int, iters: int) -> dict:
    """``{"matmul_tflops", "fp8_matmul_tflops", "hbm_gbps", "details"}`` for this device.

    GPU: 8192^3 matmuls and a 2 GiB copy (the best of :func:`_copies`' measures). CPU: 1024^3
    (512^3 quick) and 256 MiB (64 MiB), enough to give the CPU numbers a scale, nothing more.
    Raises when no bf16 matmul ran; ``fp8_matmul_tflops`` is None when no FP8 matmul ran (the
    errors are in ``details``)."""
    if platform == "gpu":
        n, copy_bytes = 8192, 2 * 2**30
    else:
        n, copy_bytes = (512, 64 * 2**20) if quick else (1024, 256 * 2**20)
    details: dict = {"matmul_n": n}
    bf16 = _matmuls(details, "bf16", n, warmup, iters, platform == "gpu")
    if bf16 is None:
        raise RuntimeError(f"no bf16 matmul ran: {details}")
    fp8 = _matmuls(details, "fp8", n, warmup, iters, platform == "gpu")
    copy = _copies(details, copy_bytes, warmup, iters, platform == "gpu")
    details["copy_source"] = copy
    return {
        "matmul_tflops": details[bf16]["tflops"],
        "fp8_matmul_tflops": details[fp8]["tflops"] if fp8 else None,
        "hbm_gbps": details[copy]["gbps"],
        "details": details,
    }
