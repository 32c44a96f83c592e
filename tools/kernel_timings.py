"""The CUDA kernels alone on the protocol shapes (device script helper; tools/gpu_check.sh).

    python3 tools/kernel_timings.py timings [--shapes S1,S3,S6]   # fwd / fwd+bwd (h saved and
                                                                  # recomputed) + a table
    JAX_MOK_CUDA_PROFILE=1 python3 tools/kernel_timings.py profile  # one fwd+bwd per shape: the
                                                                  # per-phase device times
    python3 tools/kernel_timings.py forward --shapes S3            # one forward (under ncu)
    python3 tools/kernel_timings.py compare A.txt B.txt           # two profile outputs, per phase
    python3 tools/kernel_timings.py fit P.txt [...]               # per-tile / per-stage cost of
        # each GEMM phase from profiles of derived shapes (--shapes S1-H1024,S1,S1-H4096)
    python3 tools/kernel_timings.py compile --quantization none,fp8_block  # compile seconds
    python3 tools/kernel_timings.py quantizers --quantization fp8_block    # the quantizers' GB/s
    python3 tools/kernel_timings.py timeline --shapes S1,S2 [--quantization fp8_block]  # where a
        # synchronized fwd+bwd call's wall time goes: its kernels back to back (jax.profiler
        # trace), the idle time between them, and what lies outside them (the host's events)
    python3 tools/kernel_timings.py clocks --shapes S1,S6 [--seconds 3]  # the ceiling's dot and
        # the layers alone after idle, fresh, under sustained load and right after it, with the
        # SM clock, the power and the driver's reasons for a lower clock sampled
    python3 tools/kernel_timings.py timings --quantization fp8_block,mxfp8   # the FP8 layer:
        # fwd (weights quantized inside), fwd with pre-quantized weights, fwd+bwd; against the
        # FP8 matmul ceiling. ``profile`` / ``forward`` take --quantization too (one recipe).

Balanced routing, bf16, 8 distinct random experts tiled to E (keeps the generation temporaries
small). Not the protocol (no input rotation, no peers): the harness is ``python -m benchmarks.run``.
fwd+bwd returns y with the gradients, so XLA cannot drop the forward custom call. The FP8 rows
run ``implementation="cuda"``; where the FP8 kernels are not wired in, the layer warns and runs
its pure-JAX definition, and the table says which of the two ran.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import functools
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

from benchmarks import mok_internals, peers_jax
from benchmarks.ceilings import matmul_ceiling
from benchmarks.timing import time_steps
from jax_mok import testing

UNIQUE = 8
QUANTIZATIONS = ("none", "fp8_block", "mxfp8")


def shape(name: str) -> testing.Shape:
    """A protocol shape, or one with some dimensions replaced: ``S1-H4096-F384`` is S1 with
    hidden 4096 and ffn 384 (letters T tokens, H hidden, F ffn, E experts, k top-k). Varying
    one GEMM's K at a fixed tile count separates its per-tile cost (epilogue, tile switch) from
    its per-stage cost (a linear fit over the variants' per-phase times)."""
    base, *parts = name.split("-")
    if base not in testing.SHAPES:
        raise ValueError(f"unknown shape {base!r} in {name!r}; expected one of "
                         f"{sorted(testing.SHAPES)}")
    fields = {"T": "tokens", "H": "hidden", "F": "ffn", "E": "experts", "k": "top_k"}
    changes = {}
    for part in parts:
        m = re.fullmatch(r"([THFEk])(\d+)", part)
        if not m:
            raise ValueError(f"shape {name!r}: {part!r} is not one of T<n>, H<n>, F<n>, E<n>, "
                             "k<n>")
        changes[fields[m.group(1)]] = int(m.group(2))
    return dataclasses.replace(testing.SHAPES[base], name=name, **changes)


def inputs(name: str):
    """``(x, topk_ids, topk_weights, w_gate_up, w_down, dy)`` of shape ``name``."""
    s = shape(name)
    T, H, F, E, k = s.tokens, s.hidden, s.ffn, s.experts, s.top_k
    ks = jax.random.split(jax.random.key(1), 5)
    u = min(E, UNIQUE)
    x = jax.random.normal(ks[0], (T, H), jnp.bfloat16)
    wgu = (jax.random.normal(ks[1], (u, H, 2 * F), jnp.float32) / H**0.5).astype(jnp.bfloat16)
    wd = (jax.random.normal(ks[2], (u, F, H), jnp.float32) / F**0.5).astype(jnp.bfloat16)
    w, ids = jax.lax.top_k(jax.nn.softmax(jax.random.normal(ks[3], (T, E))), k)
    dy = jax.random.normal(ks[4], (T, H), jnp.bfloat16)
    return x, ids, w, jnp.tile(wgu, (E // u, 1, 1)), jnp.tile(wd, (E // u, 1, 1)), dy


FP8_WEIGHT_GRADS = None  # --fp8-weight-grads (MoEConfig.fp8_weight_gradients; None: default)


def _experts(quantization: str, save: bool | None = None):
    """The routed-experts function of the CUDA layer: bf16 ("none", with ``save``) or FP8."""
    if quantization == "none":
        fn = mok_internals.routed_experts_bf16("cuda")
        return lambda *args: fn(*args, save_activations=save)
    return mok_internals.routed_experts_fp8(quantization, "cuda", FP8_WEIGHT_GRADS)


def forward(ids, quantization: str = "none"):
    fn = _experts(quantization)
    return jax.jit(lambda x, w, a, b: fn(x, ids, w, a, b))


def forward_backward(ids, dy, save: bool | None = None, quantization: str = "none"):
    fn = _experts(quantization, save)

    def step(x, w, a, b):
        y, vjp = jax.vjp(lambda x, w, a, b: fn(x, ids, w, a, b), x, w, a, b)
        return y, vjp(dy)

    return jax.jit(step)


def fp8_path(ids, quantization: str, x, w, wgu, wd) -> str:
    """"kernels" when the FP8 forward lowers to the FP8 custom calls, else "pure-JAX"."""
    text = forward(ids, quantization).lower(x, w, wgu, wd).as_text()
    return "kernels" if mok_internals.fp8_kernel_targets(text) else "pure-JAX"


def median_s(f, *args, n: int = 20, warmup: int = 3) -> float:
    """Median seconds of one synchronized call of ``f(*args)`` (benchmarks.timing)."""
    step = lambda i: jax.block_until_ready(f(*args))  # noqa: E731
    return statistics.median(time_steps(step, warmup=warmup, iters=n))


def back_to_back_s(f, *args, reps: int = 20, trials: int = 5) -> float:
    """Seconds per call of ``f(*args)`` when ``reps`` calls are enqueued back to back and
    synchronized once (median of ``trials``; benchmarks.timing): the GPU runs them without the
    per-call dispatch and synchronization gaps that a synchronized call of a short kernel
    (0.1 ms) mostly measures. Each call's output is dropped when the next is enqueued."""
    def step(i: int) -> None:
        out = None
        for _ in range(reps):
            out = f(*args)
        jax.block_until_ready(out)

    return statistics.median(time_steps(step, warmup=1, iters=trials)) / reps


def timings(shapes: list[str]) -> None:
    ceiling = matmul_ceiling("bf16")  # benchmarks.ceilings
    ceil = ceiling["tflops"]
    print(f"bf16 matmul ceiling ({ceiling['source']} {ceiling['n']}^3): {ceil:.0f} TFLOP/s")
    rows = []
    for name in shapes:
        x, ids, w, wgu, wd, dy = inputs(name)
        s = shape(name)
        flops = s.forward_flops()
        tf = median_s(forward(ids), x, w, wgu, wd, n=10)
        tb = {}
        for save in (True, False):
            try:
                tb[save] = median_s(forward_backward(ids, dy, save), x, w, wgu, wd, n=5)
            except Exception as e:  # e.g. out of memory for the weight gradients
                print(f"{name}: fwd+bwd (save={save}) failed: {str(e)[:200]}")
                tb[save] = float("nan")
        rows.append((name, tf, tb[True], tb[False], flops))
        print(
            f"{name}: fwd {tf * 1e3:.3f} ms {flops / tf / 1e12:.0f} TFLOP/s | fwd+bwd saved "
            f"{tb[True] * 1e3:.3f} ms {3 * flops / tb[True] / 1e12:.0f} | recomputed "
            f"{tb[False] * 1e3:.3f} ms {3 * flops / tb[False] / 1e12:.0f}",
            flush=True,
        )
        del x, ids, w, wgu, wd, dy
    print(
        "\n| shape | fwd ms | fwd TFLOP/s | % ceil | fwd+bwd ms (saved h) | TFLOP/s | % ceil "
        "| fwd+bwd ms (recompute) | TFLOP/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, tf, ts, tr, flops in rows:
        f, s, r = flops / tf / 1e12, 3 * flops / ts / 1e12, 3 * flops / tr / 1e12
        print(
            f"| {name} | {tf * 1e3:.3f} | {f:.0f} | {100 * f / ceil:.0f} | {ts * 1e3:.3f} | "
            f"{s:.0f} | {100 * s / ceil:.0f} | {tr * 1e3:.3f} | {r:.0f} |"
        )


@functools.cache
def _prepare_fn(recipe: str):
    from jax_mok.quantization import weights

    def make(a, b):
        gu, gu_t = weights.quantize_expert_weight(a, recipe, True, True)
        dn, dn_t = weights.quantize_expert_weight(b, recipe, True, True)
        return weights.Fp8Weights(gu, dn, gu_t, dn_t, recipe, a.dtype.name)

    return jax.jit(make)


def prepare(wgu, wd, recipe: str):
    """The expert weights' FP8 layouts (``jax_mok.fp8_weights``'s pytree) of bf16 ``wgu``,
    ``wd``, made by the CUDA quantizer (one compiled function per recipe)."""
    return jax.block_until_ready(_prepare_fn(recipe)(wgu, wd))


def forward_prepared(ids, recipe: str):
    fn = mok_internals.routed_experts_fp8(recipe, "cuda", FP8_WEIGHT_GRADS)
    return jax.jit(lambda x, w, a, b, p: fn(x, ids, w, a, b, prepared=p))


def forward_backward_prepared(ids, dy, recipe: str):
    """fwd+bwd reading prepared FP8 weights (the cost of one micro-batch); the gradients of the
    array weights are still returned."""
    fn = mok_internals.routed_experts_fp8(recipe, "cuda", FP8_WEIGHT_GRADS)

    def step(x, w, a, b, p):
        y, vjp = jax.vjp(lambda x, w, a, b: fn(x, ids, w, a, b, prepared=p), x, w, a, b)
        return y, vjp(dy)

    return jax.jit(step)


FP8_RUNS = ("fwd", "pq", "fwdbwd", "prep", "fwd_prep", "fwdbwd_prep")


def _peak_gb() -> float:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use", 0) / 1e9


def _fp8_times(recipe: str, name: str, x, ids, w, wgu, wd, dy,
               runs=FP8_RUNS) -> dict[str, float]:
    """Median seconds of the FP8 forward, the forward on pre-quantized weights, fwd+bwd, and
    with prepared weights (``fp8_weights``) the forward and fwd+bwd, plus the preparation
    (NaN for a run that failed, e.g. out of memory: the other runs still count)."""
    out = {}
    prepared = None
    for label in FP8_RUNS:
        if label not in runs and not (label == "prep" and {"fwd_prep", "fwdbwd_prep"} & set(runs)):
            out[label] = float("nan")
            continue
        try:
            if label == "fwd":
                out[label] = median_s(forward(ids, recipe), x, w, wgu, wd, n=10)
            elif label == "pq":
                weights = peers_jax.prequantize(wgu, wd, recipe)
                out[label] = median_s(forward(ids, recipe), x, w, *weights, n=10)
                del weights
            elif label == "fwdbwd":
                fb = forward_backward(ids, dy, quantization=recipe)
                out[label] = median_s(fb, x, w, wgu, wd, n=5)
            elif label == "prep":
                prepared = prepare(wgu, wd, recipe)
                out[label] = median_s(lambda a, b: prepare(a, b, recipe), wgu, wd, n=5)
            elif label == "fwd_prep":
                out[label] = median_s(forward_prepared(ids, recipe), x, w, wgu, wd, prepared,
                                      n=10)
            else:
                fb = forward_backward_prepared(ids, dy, recipe)
                out[label] = median_s(fb, x, w, wgu, wd, prepared, n=5)
        except Exception as e:  # noqa: BLE001 - reported, the other rows still count
            print(f"{name} {recipe}: {label} failed: {str(e)[:300]}")
            out[label] = float("nan")
        print(f"{name} {recipe}: after {label}: peak device memory {_peak_gb():.1f} GB",
              flush=True)
    del prepared
    return out


def timings_fp8(shapes: list[str], recipes: list[str], runs=FP8_RUNS) -> None:
    """Per shape and recipe: forward (weights quantized inside the layer from bf16), forward
    with pre-quantized weights (``jax_mok.quantize_params``) and fwd+bwd, against the FP8
    matmul ceiling."""
    ceiling = matmul_ceiling("fp8")
    ceil = ceiling["tflops"]
    print(f"FP8 matmul ceiling ({ceiling['source']} {ceiling['n']}^3): {ceil:.0f} TFLOP/s")
    rows = []
    for name in shapes:
        x, ids, w, wgu, wd, dy = inputs(name)
        flops = shape(name).forward_flops()
        for recipe in recipes:
            path = fp8_path(ids, recipe, x, w, wgu, wd)
            t = _fp8_times(recipe, name, x, ids, w, wgu, wd, dy, runs)
            rows.append((name, recipe, path, t, flops))
            print(f"{name} {recipe} ({path}): " + " | ".join(
                f"{k} {v * 1e3:.3f} ms" for k, v in t.items()), flush=True)
        del x, ids, w, wgu, wd, dy
    print("\n| shape | recipe | path | fwd ms | TFLOP/s | pre-quantized fwd ms | TFLOP/s "
          "| fwd+bwd ms | TFLOP/s | fp8_weights ms | fwd (prepared) ms | TFLOP/s | % FP8 ceil "
          "| fwd+bwd (prepared) ms | TFLOP/s | % FP8 ceil |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, recipe, path, t, flops in rows:
        f, q, b = flops / t["fwd"] / 1e12, flops / t["pq"] / 1e12, 3 * flops / t["fwdbwd"] / 1e12
        fp, bp = flops / t["fwd_prep"] / 1e12, 3 * flops / t["fwdbwd_prep"] / 1e12
        print(f"| {name} | {recipe} | {path} | {t['fwd'] * 1e3:.3f} | {f:.0f} | "
              f"{t['pq'] * 1e3:.3f} | {q:.0f} | {t['fwdbwd'] * 1e3:.3f} | {b:.0f} | "
              f"{t['prep'] * 1e3:.3f} | {t['fwd_prep'] * 1e3:.3f} | {fp:.0f} | "
              f"{100 * fp / ceil:.0f} | {t['fwdbwd_prep'] * 1e3:.3f} | {bp:.0f} | "
              f"{100 * bp / ceil:.0f} |")


def compile_times(shapes: list[str], quantizations: list[str]) -> None:
    """Seconds to lower and compile the layer's forward and forward+backward per shape (the
    operands as shapes only: nothing is allocated or run), and the ratio to bf16's: issue 21
    asks the FP8 layer's compile time to stay within 2x of the BF16 layer's."""
    print("| shape | layer | fwd compile s | fwd+bwd compile s | fwd+bwd vs bf16 |")
    print("|---|---|---|---|---|")
    for name in shapes:
        sh = shape(name)
        T, H, F, E, k = sh.tokens, sh.hidden, sh.ffn, sh.experts, sh.top_k
        ids = jnp.tile(jnp.arange(k, dtype=jnp.int32), (T, 1)) % E
        args = (jax.ShapeDtypeStruct((T, H), jnp.bfloat16),
                jax.ShapeDtypeStruct((T, k), jnp.float32),
                jax.ShapeDtypeStruct((E, H, 2 * F), jnp.bfloat16),
                jax.ShapeDtypeStruct((E, F, H), jnp.bfloat16))
        dy = jnp.zeros((T, H), jnp.bfloat16)
        base = None
        for q in quantizations:
            seconds = []
            for fn in (forward(ids, q), forward_backward(ids, dy, quantization=q)):
                t0 = time.perf_counter()
                fn.lower(*args).compile()
                seconds.append(time.perf_counter() - t0)
            base = seconds[1] if q == "none" else base
            ratio = f"{seconds[1] / base:.2f}x" if base and q != "none" else ""
            print(f"| {name} | {'bf16' if q == 'none' else q} | {seconds[0]:.2f} | "
                  f"{seconds[1]:.2f} | {ratio} |", flush=True)


def quantizers(shapes: list[str], recipes: list[str]) -> None:
    """Bandwidth of the CUDA quantizers (bytes read + written / time per call, calls back to
    back) against the HBM copy: the expert weights in one pass (both layouts, and the forward's
    alone), x's rows, and rows of dh's size ([T k, 2F], the backward's largest row pass)."""
    from benchmarks.ceilings import copy_ceiling
    from jax_mok.kernels import _ffi

    _ffi.cuda_module()  # registers the targets (the layer does this when it picks the kernels)

    ceiling = copy_ceiling()
    copy = ceiling["gbps"]
    print(f"HBM copy (read + write, 2 GiB, best of the harness's measures: {ceiling['source']}): "
          f"{copy:.0f} GB/s")
    print("| shape | recipe | what | bytes | ms | GB/s | % of copy |")
    print("|---|---|---|---|---|---|---|")
    for name in shapes:
        _quantizers_one_shape(name, recipes, copy)


def _quantizers_one_shape(name: str, recipes: list[str], copy: float) -> None:
    """quantizers() for one shape. A function of its own so that every reference to the shape's
    arrays (the cases, the loop variables) is gone before the next shape allocates; in one loop
    the last shape's `cases` still held its weights while the next shape's were made."""
    from jax_mok.kernels import targets

    x, ids, w, wgu, wd, dy = inputs(name)
    del ids, w, dy
    s = shape(name)
    # The backward's `quantize dh` pass: [T k, 2F] rows (the largest row pass of a step).
    dh = jax.random.normal(jax.random.key(2), (s.tokens * s.top_k, 2 * s.ffn), jnp.bfloat16)
    for recipe in recipes:
        cases = (
            ("weights, both layouts",
             functools.partial(targets.quantize_weight_both, recipe=recipe), (wgu, wd), 2),
            ("weights, forward layout",
             functools.partial(targets.quantize_weight, recipe=recipe, axis=1), (wgu, wd), 1),
            ("x rows", functools.partial(targets.quantize_rows, recipe=recipe), (x,), 1),
            ("dh rows", functools.partial(targets.quantize_rows, recipe=recipe), (dh,), 1))
        for what, fn, arrays, out_per_elem in cases:
            jitted = jax.jit(fn)
            seconds = sum(back_to_back_s(jitted, a) for a in arrays)
            elems = sum(a.size for a in arrays)
            scale_bytes = elems * out_per_elem / 32  # <= 1 byte per 32 elements per layout
            nbytes = elems * (2 + out_per_elem) + scale_bytes
            gbps = nbytes / seconds / 1e9
            print(f"| {name} | {recipe} | {what} | {nbytes / 1e9:.2f} GB | "
                  f"{seconds * 1e3:.3f} | {gbps:.0f} | {100 * gbps / copy:.0f} |", flush=True)


def profile(shapes: list[str], quantization: str = "none") -> None:
    """Two fwd+bwd calls per shape; with JAX_MOK_CUDA_PROFILE=1 the kernels print each phase's
    device time to stderr, and the marker line names the second (warm) call. FP8 runs are
    marked ``S1:fp8_block`` etc., so ``compare`` pairs them with FP8 runs only."""
    for name in shapes:
        x, ids, w, wgu, wd, dy = inputs(name)
        fb = forward_backward(ids, dy, quantization=quantization)
        jax.block_until_ready(fb(x, w, wgu, wd))  # compile + first call
        s = shape(name)
        label = name if quantization == "none" else f"{name}:{quantization}"
        path = "" if quantization == "none" else f" [{fp8_path(ids, quantization, x, w, wgu, wd)}]"
        print(
            f"--- {label} T={s.tokens} H={s.hidden} F={s.ffn} E={s.experts} k={s.top_k}{path} "
            "(second call below)",
            file=sys.stderr,
            flush=True,
        )
        jax.block_until_ready(fb(x, w, wgu, wd))
        # the phases print as they finish: the next shape's first call (its weight quantization
        # comes before its routing) must not be read as this one's
        print(f"{END_MARK}{label}", file=sys.stderr, flush=True)
        del x, ids, w, wgu, wd, dy, fb


def _call_intervals(events: list[tuple[str, int, int]], calls: int) -> list[list[list[int]]]:
    """The union of the device events' ``(name, start_ns, duration_ns)`` intervals (busy
    intervals, in order) cut into ``calls`` groups at the ``calls - 1`` widest gaps between them:
    each synchronized call waits for the host before the next, so its gaps are the widest."""
    if calls < 1:
        raise ValueError("calls must be >= 1")
    evs = sorted((start, start + dur) for _, start, dur in events if dur >= 0)
    if len(evs) < calls:
        raise ValueError(f"{len(evs)} device events for {calls} calls")
    busy = [list(evs[0])]
    for start, stop in evs[1:]:
        if start > busy[-1][1]:
            busy.append([start, stop])
        else:
            busy[-1][1] = max(busy[-1][1], stop)
    if len(busy) < calls:
        raise ValueError(f"{len(busy)} busy intervals for {calls} calls")
    gaps = [busy[i + 1][0] - busy[i][1] for i in range(len(busy) - 1)]
    cuts = sorted(sorted(range(len(gaps)), key=gaps.__getitem__)[len(gaps) - (calls - 1):])
    bounds = [0, *(i + 1 for i in cuts), len(busy)]
    return [busy[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def timeline_stats(events: list[tuple[str, int, int]], calls: int) -> dict:
    """What ``calls`` synchronized calls' device events ``(name, start_ns, duration_ns)`` say.
    The events' busy intervals are cut into calls (:func:`_call_intervals`), and per call
    (medians over the calls) ``span_ms`` (first start to last end), ``busy_ms`` (the intervals'
    length), ``idle_ms`` (span - busy: the device waiting inside a call), ``largest_gap_us``;
    ``events_per_call``; ``kernels``: each event name's summed duration per call (ms, largest
    first)."""
    per_call = _call_intervals(events, calls)
    med = statistics.median
    spans = [c[-1][1] - c[0][0] for c in per_call]
    lengths = [sum(e - s for s, e in c) for c in per_call]
    per_name: dict[str, float] = {}
    for name, _, dur in events:
        per_name[name] = per_name.get(name, 0.0) + dur
    return {
        "calls": calls,
        "events_per_call": sum(dur >= 0 for _, _, dur in events) / calls,
        "span_ms": med(spans) / 1e6,
        "busy_ms": med(lengths) / 1e6,
        "idle_ms": med([s - n for s, n in zip(spans, lengths, strict=True)]) / 1e6,
        "largest_gap_us": med([max((b[0] - a[1] for a, b in zip(c, c[1:], strict=False)),
                                   default=0) for c in per_call]) / 1e3,
        "kernels": sorted(((ns / calls / 1e6, name) for name, ns in per_name.items()),
                          reverse=True),
    }


def host_stats(host_events: list[tuple[str, str, int, int]],
               device_events: list[tuple[str, int, int]], calls: int,
               call_event: str = "PjitFunction") -> dict:
    """Where the host's time goes around ``calls`` synchronized calls, from host events ``(line,
    name, start_ns, duration_ns)`` (:func:`_host_events`) and the device events that
    :func:`timeline_stats` reads, on the trace's one clock. The device events are cut into calls
    as there; call i's host window is (end of call i-1's last device interval, end of call i's
    last device interval] (the first call's opens at -inf). Per call, medians over the calls:
    ``lead_ms``: call i's first device start minus the start of the earliest host event in its
    window, before that device start, whose name starts with ``call_event`` (a jitted call's
    dispatch, ``PjitFunction(step)``): how long the host worked on the call before the device
    started. Calls without one are left out (None where all are). ``call_event=""`` takes any
    event, the first after the previous call's kernels ended, on any thread: the previous call's
    return from synchronization then counts too, and the first call's lead holds what the trace
    recorded before it. ``lead_event``: the name the lead was taken from in the most calls.
    ``between_ms``: the device's idle time from a call's last kernel to the next call's first
    (None with one call): the next call's lead plus this call's return and the loop between calls.
    ``host_top``: per event name, the summed duration of the events that start in the window
    ((ms, name), largest first, 0 ms left out). Nested events (a PjitFunction around its
    execution) each count in full, so the names' times overlap and may add up to more than the
    wall time."""
    windows = [(c[0][0], c[-1][1]) for c in _call_intervals(device_events, calls)]
    evs = sorted((start, dur, name) for _, name, start, dur in host_events)
    starts = [start for start, _, _ in evs]
    leads, names, sums = [], [], []
    prev_end = float("-inf")
    for first, end in windows:
        i, j = bisect.bisect_right(starts, prev_end), bisect.bisect_left(starts, first)
        lead = next(((s, n) for s, _, n in evs[i:j] if n.startswith(call_event)), None)
        if lead is not None:
            leads.append(first - lead[0])
            names.append(lead[1])
        per_name: dict[str, int] = {}
        for _, dur, name in evs[i:bisect.bisect_right(starts, end)]:
            per_name[name] = per_name.get(name, 0) + dur
        sums.append(per_name)
        prev_end = end
    med = statistics.median
    between = [b[0] - a[1] for a, b in zip(windows, windows[1:], strict=False)]
    top = ((med([s.get(n, 0) for s in sums]) / 1e6, n) for n in set().union(*sums))
    return {
        "lead_ms": med(leads) / 1e6 if leads else None,
        "lead_event": statistics.mode(names) if names else None,
        "between_ms": med(between) / 1e6 if between else None,
        "host_top": sorted((t for t in top if t[0] > 0), reverse=True),
    }


def _device_events(trace_dir: str) -> list[tuple[str, int, int]]:
    """``(name, start_ns, duration_ns)`` of every event on the GPU planes' stream lines of the
    newest trace under ``trace_dir`` (kernels, memsets and copies, as CUPTI reports them)."""
    from benchmarks.e2e.breakdown import latest_profile

    data, _ = latest_profile(trace_dir)
    out, seen = [], []
    for plane in data.planes:
        seen.append(f"{plane.name}: {[line.name for line in plane.lines]}")
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if not line.name.lower().startswith("stream"):
                continue  # per-stream lines only (others repeat the kernels or hold counters)
            out.extend((ev.name, int(ev.start_ns), int(ev.duration_ns)) for ev in line.events)
    if not out:
        raise ValueError("no GPU stream events in the trace; its planes and lines: "
                         + "; ".join(seen)[:2000])
    return out


def _host_events(trace_dir: str) -> list[tuple[str, str, int, int]]:
    """``(line, name, start_ns, duration_ns)`` of every event on the host planes (``/host:CPU``;
    on a GPU also CUPTI's CUDA API calls) of the newest trace under ``trace_dir``: a line per
    thread, e.g. ``python`` (PjitFunction, ExecuteHelper, the Python tracer's ``$file:line
    function`` frames) and the XLA thread pools' ``tf_XLA...``. Its timestamps share the device
    events' clock (both count from the trace's start)."""
    from benchmarks.e2e.breakdown import latest_profile

    data, _ = latest_profile(trace_dir)
    out = [(line.name, ev.name, int(ev.start_ns), int(ev.duration_ns))
           for plane in data.planes if plane.name.startswith("/host:")
           for line in plane.lines for ev in line.events]
    if not out:
        raise ValueError("no host events in the trace; its planes: "
                         + ", ".join(plane.name for plane in data.planes))
    return out


def _short(name: str, width: int = 70) -> str:
    """A kernel's mangled name cut to what tells kernels apart (their function and first template
    arguments)."""
    m = re.search(r"[A-Za-z_]*kernel\w*", name)  # a mangled name's digits end the run
    return (name if m is None else name[m.start():])[:width]


SMI_FIELDS = "clocks.sm,power.draw"
SMI_FORMAT = ["--format=csv,noheader,nounits", "-i", "0"]
# The bits of nvidia-smi's clocks event (throttle) reasons mask that say why the SM clock is
# below its maximum (nvml's clocksEventReasons; 0x1, the idle GPU, is not a limit).
CLOCK_REASONS = {0x2: "application clocks", 0x4: "sw power cap", 0x8: "hw slowdown",
                 0x10: "sync boost", 0x20: "sw thermal", 0x40: "hw thermal",
                 0x80: "hw power brake", 0x100: "display clock"}


def parse_smi(lines: list[str]) -> dict | None:
    """Median SM clock (MHz), its minimum and median power (W) of ``nvidia-smi`` lines
    ``"1980, 512.34"`` (:func:`smi_command`'s fields); where the lines carry a third field, the
    clocks event reasons mask (``"0x0000000000000004"``), ``"reasons"`` names every limiting
    reason seen in any sample (CLOCK_REASONS; empty: none). None without a readable line."""
    rows, masks = [], []
    for line in lines:
        fields = [v.strip() for v in line.split(",")]
        try:
            mhz, watts = float(fields[0]), float(fields[1])
            mask = int(fields[2], 16) if len(fields) > 2 else None
        except (ValueError, IndexError):
            continue
        rows.append((mhz, watts))
        if mask is not None:
            masks.append(mask)
    if not rows:
        return None
    out = {"mhz": statistics.median(m for m, _ in rows), "min_mhz": min(m for m, _ in rows),
           "watts": statistics.median(w for _, w in rows), "samples": len(rows)}
    if masks:
        seen = 0
        for m in masks:
            seen |= m
        out["reasons"] = [name for bit, name in CLOCK_REASONS.items() if seen & bit]
    return out


@functools.cache
def smi_command() -> list[str] | None:
    """The sampling command (every 50 ms, read only: nothing is set): the SM clock, the power
    and, where this driver knows one of its names, the clocks event reasons mask; None without
    nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        fields = f"{SMI_FIELDS},{reasons}"
        probe = subprocess.run([smi, f"--query-gpu={fields}", *SMI_FORMAT],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode == 0 and parse_smi(probe.stdout.splitlines()) is not None:
            return [smi, f"--query-gpu={fields}", *SMI_FORMAT, "-lms", "50"]
    return [smi, f"--query-gpu={SMI_FIELDS}", *SMI_FORMAT, "-lms", "50"]


def power_limits() -> str:
    """GPU 0's enforced and default power limits and its maximum SM clock, as nvidia-smi reports
    them (read only), or "-"."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "-"
    q = subprocess.run([smi, "--query-gpu=enforced.power.limit,power.default_limit,"
                        "clocks.max.sm,temperature.gpu", *SMI_FORMAT],
                       capture_output=True, text=True, timeout=30)
    if q.returncode != 0 or not q.stdout.strip():
        return "-"
    limit, default, max_sm, temp = (v.strip() for v in q.stdout.strip().split(","))
    return (f"power limit {limit} W (default {default} W), max SM clock {max_sm} MHz, "
            f"{temp} C now")


@contextlib.contextmanager
def gpu_clocks(command: list[str] | None = None):
    """Samples GPU 0's SM clock and power (and the clocks event reasons, :func:`smi_command`)
    every 50 ms while the block runs; yields a dict that holds :func:`parse_smi`'s result under
    ``"clocks"`` afterwards (None where nvidia-smi is absent or printed nothing)."""
    out: dict = {"clocks": None}
    command = command or smi_command()
    if command is None:
        yield out
        return
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        time.sleep(0.1)  # its first sample, before the work starts
        yield out
    finally:
        proc.terminate()
        text, _ = proc.communicate(timeout=10)
        out["clocks"] = parse_smi(text.splitlines())


def _clock_text(c: dict | None) -> str:
    if c is None:
        return "-"
    text = (f"{c['mhz']:.0f} MHz (min {c['min_mhz']:.0f}), {c['watts']:.0f} W, "
            f"{c['samples']} samples")
    if "reasons" in c:
        text += f", limited by: {', '.join(c['reasons']) or 'nothing'}"
    return text


def timeline(shapes: list[str], quantization: str = "none", calls: int = 5) -> None:
    """Per shape: the synchronized call's wall time (as the protocol times it), the same calls
    enqueued back to back, and a jax.profiler trace of ``calls`` synchronized calls read back:
    the kernels' span and busy time per call, the device's idle time inside a call, and each
    kernel's time. wall - span is host dispatch and synchronization; idle is the device waiting
    between kernels; a kernel slower here than in ``profile`` (which serializes the phases) ran
    slower back to back. ``clocks``: GPU 0's SM clock and power while the synchronized and the
    back-to-back calls ran (:func:`gpu_clocks`). The ``host`` lines read the same trace's host
    threads (:func:`host_stats`): the host's lead before each call's first kernel and what it
    spends its time on around a call."""
    import tempfile

    for name in shapes:
        x, ids, w, wgu, wd, dy = inputs(name)
        fb = forward_backward(ids, dy, quantization=quantization)
        jax.block_until_ready(fb(x, w, wgu, wd))
        with gpu_clocks() as synced:
            wall = median_s(fb, x, w, wgu, wd, n=10) * 1e3
        with gpu_clocks() as ahead:
            b2b = back_to_back_s(fb, x, w, wgu, wd, reps=10) * 1e3
        with tempfile.TemporaryDirectory() as d:
            with jax.profiler.trace(d):
                for _ in range(calls):
                    jax.block_until_ready(fb(x, w, wgu, wd))
            device = _device_events(d)
            st = timeline_stats(device, calls)
            try:
                host: dict | str = host_stats(_host_events(d), device, calls)
            except ValueError as e:  # the device part stands without it
                host = str(e)
        label = name if quantization == "none" else f"{name}:{quantization}"
        print(f"timeline {label}: wall {wall:.3f} ms, back to back {b2b:.3f} ms per call; trace: "
              f"span {st['span_ms']:.3f} ms, busy {st['busy_ms']:.3f}, idle inside "
              f"{st['idle_ms']:.3f} (largest gap {st['largest_gap_us']:.1f} us, "
              f"{st['events_per_call']:.0f} events a call)", flush=True)
        print(f"  clocks: synchronized {_clock_text(synced['clocks'])}; back to back "
              f"{_clock_text(ahead['clocks'])}", flush=True)
        for ms, kernel in st["kernels"][:14]:
            print(f"  {ms:8.3f} ms  {_short(kernel)}", flush=True)
        if isinstance(host, str):
            print(f"  host: {host}", flush=True)
        else:
            fmt = lambda v: "-" if v is None else f"{v:.3f} ms"
            print(f"  host lead {fmt(host['lead_ms'])} from {host['lead_event']} to the first "
                  f"kernel; device idle between calls {fmt(host['between_ms'])}; host events per "
                  "call (nested ones counted in each):", flush=True)
            for ms, event in host["host_top"][:20]:
                print(f"  host {ms:8.3f} ms  {event[:70]}", flush=True)
        del x, ids, w, wgu, wd, dy, fb


PHASE = "jax_mok CUDA profile: "
END_MARK = "--- end of "


def read_profile(path: str) -> dict[str, list[tuple[str, float]]]:
    """Per shape, the phases of the warm (second) fwd+bwd call in a ``profile`` output: the lines
    after the shape's marker, up to its end marker (or, in outputs without one, up to the next
    call's first ``routing``: a call routes twice)."""
    shapes: dict[str, list[tuple[str, float]]] = {}
    current = None
    for line in open(path, errors="replace"):
        if line.startswith(END_MARK):  # written after the warm call (older outputs lack it)
            current = None
            continue
        if line.startswith("--- "):
            current = line.split()[1]
            shapes[current] = []
            continue
        if current is None or PHASE not in line:
            continue
        name, ms = line.split(PHASE, 1)[1].rsplit(None, 2)[:2]
        phases = shapes[current]
        if name.strip() == "routing" and sum(n == "routing" for n, _ in phases) == 2:
            current = None  # the next shape's first call
            continue
        phases.append((name.strip(), float(ms)))
    return shapes


def compare(first: str, second: str) -> None:
    """Markdown table: every phase of two profile outputs side by side, per shape."""
    a, b = read_profile(first), read_profile(second)
    print(f"| shape | phase | {first} ms | {second} ms | change |")
    print("|---|---|---|---|---|")
    def keyed(phases):  # (name, occurrence): "routing" runs once per pass
        seen: dict[str, int] = {}
        out = {}
        for name, ms in phases:
            seen[name] = seen.get(name, 0) + 1
            out[(name, seen[name])] = ms
        return out

    for shape in a:
        if shape not in b:
            continue
        ka, kb = keyed(a[shape]), keyed(b[shape])
        for key in list(ka) + [k for k in kb if k not in ka]:
            ta, tb = ka.get(key), kb.get(key)
            cells = [f"{t:.3f}" if t is not None else "–" for t in (ta, tb)]
            change = f"{100 * (tb / ta - 1):+.0f} %" if ta and tb is not None else "–"
            print(f"| {shape} | {key[0]} | {cells[0]} | {cells[1]} | {change} |")
        ta, tb = sum(ka.values()), sum(kb.values())
        print(f"| {shape} | **total** | {ta:.3f} | {tb:.3f} | {100 * (tb / ta - 1):+.0f} % |")


# The GEMM phases of a profile and their problem: (tile-count function, K) of a shape; BK of a
# stage is 64 (bf16) or 128 (FP8). Routed rows are counted as balanced (T k / E per expert).
SMS = 132
CTA_TILE = (128, 256)


def _phase_problem(phase: str, s: testing.Shape) -> tuple[int, int] | None:
    """(CTA tiles, K) of one GEMM phase of ``s`` by its profile name, None for other phases."""
    m_tiles = s.experts * -(-(s.tokens * s.top_k // s.experts) // CTA_TILE[0])
    positions = s.tokens * s.top_k // s.experts  # per expert: the weight gradients' K
    if "gate/up GEMM" in phase:
        return m_tiles * -(-s.ffn // (CTA_TILE[1] // 2)), s.hidden
    if "down GEMM" in phase:
        return m_tiles * -(-s.hidden // CTA_TILE[1]), s.ffn
    if "dy Wd^T GEMM" in phase:
        return m_tiles * -(-s.ffn // CTA_TILE[1]), s.hidden
    if "dh Wgu^T GEMM" in phase:
        return m_tiles * -(-s.hidden // CTA_TILE[1]), 2 * s.ffn
    if phase.startswith("dWd GEMM"):
        return s.experts * -(-s.ffn // CTA_TILE[0]) * -(-s.hidden // CTA_TILE[1]), positions
    if phase.startswith("dWgu GEMM"):
        return s.experts * -(-s.hidden // CTA_TILE[0]) * -(-(2 * s.ffn) // CTA_TILE[1]), positions
    return None


def fit_stages(profiles: dict[str, list[tuple[str, float]]], ceilings: dict[str, float]
               ) -> list[dict]:
    """Per GEMM phase, per-tile and per-stage cost from runs of derived shapes that keep the
    phase's tile count and change its K (``S1-H1024``, ``S1``, ``S1-H4096``): a least-squares
    line ``ms = a + b K`` over them. Per stage (BK = 64 for bf16 phases, 128 for ``fp8 ...``
    ones) and tile: ``b BK / waves``, against the ideal ``2 * 128 * 256 * BK`` FLOPs at the
    phase's ceiling (TFLOP/s, ``ceilings["bf16"]`` / ``["fp8"]``) spread over the SMs; per
    tile: ``a / waves`` (epilogue, tile switch: whatever does not grow with K)."""
    points: dict[tuple[str, int], list[tuple[int, float, str]]] = {}
    for label, phases in profiles.items():
        s = shape(label.split(":")[0])
        seen: set[str] = set()
        for phase, ms in phases:
            problem = _phase_problem(phase, s)
            if problem is None or phase in seen:  # the first occurrence of a phase per run
                continue
            seen.add(phase)
            tiles, k = problem
            points.setdefault((phase, tiles), []).append((k, ms, label))
    rows = []
    for (phase, tiles), pts in points.items():
        if len({k for k, _, _ in pts}) < 2:
            continue
        n = len(pts)
        mk = sum(k for k, _, _ in pts) / n
        mt = sum(t for _, t, _ in pts) / n
        b = sum((k - mk) * (t - mt) for k, t, _ in pts) / sum((k - mk) ** 2 for k, _, _ in pts)
        a = mt - b * mk
        fp8 = phase.startswith("fp8 ")
        bk = 128 if fp8 else 64
        waves = tiles / SMS
        stage_us = 1e3 * b * bk / waves
        ideal_us = 2 * CTA_TILE[0] * CTA_TILE[1] * bk / (ceilings["fp8" if fp8 else "bf16"]
                                                          * 1e12 / SMS) * 1e6
        worst = max(abs(t - (a + b * k)) / t for k, t, _ in pts)
        rows.append({"phase": phase, "tiles": tiles, "runs": [lbl for _, _, lbl in sorted(pts)],
                     "k": sorted(k for k, _, _ in pts), "tile_us": 1e3 * a / waves,
                     "stage_us": stage_us, "ideal_stage_us": ideal_us,
                     "stage_efficiency": ideal_us / stage_us, "worst_residual": worst})
    return rows


def fit(paths: list[str], ceilings: dict[str, float]) -> None:
    """Markdown table of :func:`fit_stages` over the runs of one or more profile outputs."""
    profiles = {}
    for path in paths:
        profiles.update(read_profile(path))
    rows = fit_stages(profiles, ceilings)
    print(f"| phase | tiles | K | per tile us | per stage us | ideal us | of the ceiling "
          f"({ceilings['bf16']:g} / {ceilings['fp8']:g} TFLOP/s) | worst residual |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['phase']} | {r['tiles']} | {', '.join(map(str, r['k']))} | "
              f"{r['tile_us']:.2f} | {r['stage_us']:.3f} | {r['ideal_stage_us']:.3f} | "
              f"{100 * r['stage_efficiency']:.0f} % | {100 * r['worst_residual']:.1f} % |")


def _fresh_then_hot(f, args: tuple, seconds: float) -> list[tuple[str, float, dict | None]]:
    """ms per call of ``f(*args)`` in four conditions, each with GPU 0's clocks sampled beside
    it: "alone after idle" (one synchronized call after 1 s idle, median of 3: the per-phase
    profile's condition, a single call on a rested GPU), "fresh" (after 2 s idle:
    :func:`median_s`, the protocol's way), "back to back" (:func:`back_to_back_s`, its five
    trials sized to ~``seconds`` of calls in all) and "synchronized after" (the fresh measure
    again, right after that load)."""
    rows = []
    alone = []
    with gpu_clocks() as c:
        for _ in range(3):
            time.sleep(1.0)
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            alone.append((time.perf_counter() - t0) * 1e3)
    rows.append(("alone after idle", statistics.median(alone), c["clocks"]))
    time.sleep(2.0)  # an idle GPU, as the harness's first item of a shape finds it
    with gpu_clocks() as c:
        fresh = median_s(f, *args) * 1e3
    rows.append(("fresh", fresh, c["clocks"]))
    reps = max(1, round(seconds * 1e3 / 5 / max(fresh, 1e-3)))
    with gpu_clocks() as c:
        hot = back_to_back_s(f, *args, reps=reps, trials=5) * 1e3
    rows.append((f"back to back {seconds:g} s", hot, c["clocks"]))
    with gpu_clocks() as c:
        after = median_s(f, *args) * 1e3
    rows.append(("synchronized after", after, c["clocks"]))
    return rows


def clocks(shapes: list[str], quantization: str = "none", seconds: float = 3.0,
           n: int = 8192) -> None:
    """Whether the protocol's ceiling and its layer rows are taken in the same state of the GPU.
    The bf16 matmul of the ceiling (XLA ``jnp.dot``, 8192^3: ~30 ms of work per measure) and each
    shape's fwd+bwd, each alone after idle, fresh, under ``seconds`` of sustained load and right
    after it (:func:`_fresh_then_hot`), with the SM clock, the power and the reasons the driver
    gives for a clock below its maximum. The samples are 50-ms averages: a measure shorter than
    that reads mostly the idle GPU around it, so compare the ms columns first. Each workload's
    inputs live only while it runs; one that does not fit prints an "out of memory" row and the
    next one runs."""
    print(f"GPU 0: {power_limits()}", flush=True)

    def dot():  # n^3 bf16: each operand (128 MiB at 8192) far larger than the L2
        a, b = (jax.random.normal(k, (n, n), jnp.float32).astype(jnp.bfloat16)
                for k in jax.random.split(jax.random.key(3)))
        return jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.bfloat16)), (a, b)

    def layer(name: str):
        x, ids, w, wgu, wd, dy = inputs(name)
        return forward_backward(ids, dy, quantization=quantization), (x, w, wgu, wd)

    work = [(f"bf16 dot {n}^3", 2 * n**3, dot)]
    for name in shapes:
        label = name if quantization == "none" else f"{name}:{quantization}"
        work.append((f"{label} fwd+bwd", 3 * shape(name).forward_flops(),
                     functools.partial(layer, name)))
    print("| work | condition | ms per call | TFLOP/s | SM clock |", flush=True)
    print("|---|---|---|---|---|", flush=True)
    for label, flops, make in work:
        try:
            f, args = make()
            jax.block_until_ready(f(*args))  # compiled before any timed condition
            rows = _fresh_then_hot(f, args, seconds)
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            print(f"| {label} | out of memory | - | - | - |", flush=True)
            continue
        finally:
            f = args = None  # the workload's inputs go before the next one's are made
        for cond, ms, c in rows:
            print(f"| {label} | {cond} | {ms:.3f} | {flops / ms / 1e9:.0f} | "
                  f"{_clock_text(c)} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("timings", "profile", "forward", "compare", "quantizers",
                                     "compile", "fit", "timeline", "clocks"))
    ap.add_argument("files", nargs="*", help="compare: two profile outputs; fit: any number")
    ap.add_argument("--ceilings", default="738,1400",
                    help="fit: the bf16 and FP8 matmul ceilings (TFLOP/s) of the profiled run")
    ap.add_argument("--shapes", default="S1,S2,S3,S4,S5,S6")
    ap.add_argument("--fp8-runs", default=",".join(FP8_RUNS),
                    help=f"timings of the FP8 layer: a comma list from {FP8_RUNS}")
    ap.add_argument("--quantization", default="none",
                    help=f"comma list from {QUANTIZATIONS} (profile / forward: one value)")
    ap.add_argument("--fp8-weight-grads", default=None, choices=("fp8", "unquantized"),
                    help="MoEConfig.fp8_weight_gradients of the FP8 runs (default: the "
                         "layer's, MoEConfig.weight_gradient_mode)")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="clocks: seconds of sustained load per workload")
    args = ap.parse_args()
    global FP8_WEIGHT_GRADS
    FP8_WEIGHT_GRADS = args.fp8_weight_grads
    quantizations = args.quantization.split(",")
    bad = [q for q in quantizations if q not in QUANTIZATIONS]
    if bad or not quantizations:
        ap.error(f"--quantization: expected a comma list from {QUANTIZATIONS}, got "
                 f"{args.quantization!r}")
    if args.what in ("profile", "forward", "timeline", "clocks") and len(quantizations) != 1:
        ap.error(f"--quantization: {args.what} takes one value, got {args.quantization!r}")
    if args.what == "profile" and os.environ.get("JAX_MOK_CUDA_PROFILE", "0").lower() not in (
            "1", "true", "on"):
        # without it the kernels print no phase times and the output holds only the markers
        ap.error("profile needs JAX_MOK_CUDA_PROFILE=1 in the environment (the kernels print "
                 "each phase's device time only then)")
    if args.what in ("timeline", "clocks") and os.environ.get(
            "JAX_MOK_CUDA_PROFILE", "0").lower() in ("1", "true", "on"):
        ap.error(f"{args.what} times the calls as they run: unset JAX_MOK_CUDA_PROFILE (it "
                 "synchronizes the host after every phase)")
    if args.what == "clocks" and not args.seconds > 0:
        ap.error(f"--seconds: expected a positive number of seconds, got {args.seconds}")
    if args.what == "compare":
        if len(args.files) != 2:
            ap.error("compare takes two profile output files")
        compare(*args.files)
        return
    if args.what == "fit":
        if not args.files:
            ap.error("fit takes profile output files (runs of derived shapes: S1-H1024, ...)")
        bf16, fp8 = (float(v) for v in args.ceilings.split(","))
        fit(args.files, {"bf16": bf16, "fp8": fp8})
        return
    shapes = args.shapes.split(",")
    for name in shapes:
        try:
            shape(name)
        except ValueError as e:
            ap.error(f"--shapes: {e}")
    print(mok_internals.extension_fingerprint(), flush=True)
    if args.what == "compile":
        compile_times(shapes, quantizations)
    elif args.what == "quantizers":
        quantizers(shapes, [q for q in quantizations if q != "none"] or ["fp8_block"])
    elif args.what == "timings":
        if "none" in quantizations:
            timings(shapes)
        recipes = [q for q in quantizations if q != "none"]
        if recipes:
            timings_fp8(shapes, recipes, args.fp8_runs.split(","))
    elif args.what == "profile":
        profile(shapes, quantizations[0])
    elif args.what == "timeline":
        timeline(shapes, quantizations[0])
    elif args.what == "clocks":
        clocks(shapes, quantizations[0], args.seconds)
    else:
        for name in shapes:
            x, ids, w, wgu, wd, _ = inputs(name)
            jax.block_until_ready(forward(ids, quantizations[0])(x, w, wgu, wd))


if __name__ == "__main__":
    main()
