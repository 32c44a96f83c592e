"""Device-synchronized timing: warm-ups, then one wall-clock sample per iteration."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def time_steps(step: Callable[[int], None], *, warmup: int, iters: int) -> list[float]:
    """Runs ``step(i)`` ``warmup`` times untimed, then ``iters`` times timed; returns seconds.

    ``step(i)`` must run input set ``i`` (modulo the number of sets) and return only once the
    device is done (``block_until_ready`` / ``torch.cuda.synchronize``), so that every sample is
    one whole, synchronized call.
    """
    for i in range(warmup):
        step(i)
    samples = []
    for i in range(iters):
        start = time.perf_counter()
        step(warmup + i)
        samples.append(time.perf_counter() - start)
    return samples


def summarize(samples_s: list[float]) -> dict:
    """Median / min / mean / max in milliseconds, plus every raw sample in milliseconds."""
    ms = [s * 1e3 for s in samples_s]
    return {
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
        "mean_ms": statistics.fmean(ms),
        "max_ms": max(ms),
        "times_ms": ms,
    }
