"""End-to-end training benchmark: tokens/s and MFU of a decoder-only MoE transformer.

    python -m benchmarks.e2e.run                              # one H200: auto layers, 8 x 4096
    python -m benchmarks.e2e.run --layers 4 --variants jax_mok,padded
    python -m benchmarks.e2e.run --variants jax_mok,jax_mok_fp8_block,jax_mok_mxfp8  # BF16 vs FP8
    python -m benchmarks.e2e.run --expert-parallel            # experts over every local device
    python -m benchmarks.e2e.run --tiny --steps 2             # CPU smoke run (seq 32)
    python -m benchmarks.e2e.run --batch 16 --micro-batches 4 \
        --variants jax_mok,jax_mok_fp8_block,jax_mok_fp8_block_prepared  # gradient accumulation
    python -m benchmarks.e2e.run --layers 4 --batch 32 --batch-policy shared --own-best \
        --breakdown                     # issue 22's table (benchmarks/README.md: the command)

Variants (benchmarks/e2e/model.py, VARIANT_TEXT): ``jax_mok`` (jax_mok.moe, BF16 GEMMs),
``jax_mok_fp8_block`` and ``jax_mok_mxfp8`` (the same layer with
``MoEConfig(quantization="fp8_block" / "mxfp8")``, nothing else changed),
``jax_mok_fp8_block_prepared`` (fp8_block with the expert weights quantized once per optimizer
step by ``jax_mok.fp8_weights``, inside the step from its current parameters and before the
gradient, so every micro-batch of the step (``--micro-batches``, summed by a ``lax.scan``)
shares them; skipped, with the reason
logged and recorded, where jax_mok has no ``fp8_weights``), ``reference`` (pure XLA:
``lax.ragged_dot``) and ``padded`` (batched einsum at a measured capacity, B2).

Each variant builds the same model (same seed, same parameters), compiles one jitted training
step (loss, gradients, optax.adamw update; the state donated), runs ``--warmup`` steps, then
times ``--steps`` synchronized steps. Batch (per device), ``--batch-policy``: ``fixed`` (the
default) runs every variant at ``--batch``, a variant that runs out of device memory retried at
half the batch (``--oom-retries`` times) and the batch it ran at reported; ``shared`` first finds
the largest batch at which ``--batch-anchor`` (the padded einsum, MaxText's GPU MoE path) runs,
from ``--batch`` halving on out-of-memory (every attempt recorded in ``batch_search``), then runs
every other variant once at that batch (one that fails there, e.g. ``reference``'s ragged_dot,
keeps its row with the status and error); ``--own-best`` adds rows ``<variant> (own best
batch)`` for jax_mok's variants at the fastest of doubling batches from the shared one (until
out of memory, ``--own-best-cap`` or a gain under ``--own-best-min-gain``). ``--breakdown``
profiles ``--profile-steps`` more steps of each (shared-batch) row and splits its step time
into the MoE layers and the rest (benchmarks/e2e/breakdown.py). MFU counts the
same model FLOPs for every variant: an FP8 GEMM counts as its BF16 FLOPs, against the BF16
matmul ceiling measured in the run. Writes e2e.json, e2e.md and e2e.png to ``--out`` (the JSON
after every variant).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import pathlib
import shlex
import sys
import time

from benchmarks.run import git_commit

GIB = 2**30
# Per token per layer, bytes kept for the backward in bf16 (estimates for the automatic layer
# count): jax_mok ~ x, q, k, v, attention out, norms (~27 KB) + routed rows and gate/up
# activations (k (2F + F) bf16 ~ 37 KB) + slack; the padded form holds [E, C, .] buffers with
# float32 gate/up (C E ~ 1.1 T k).
# The FP8 variants also keep FP8 copies of the routed rows and, on CUDA, h [T k, 2F] in bf16; the
# prepared one adds ~1 B per expert parameter (inside the 10 % margin, not counted).
ACTIVATION_BYTES = {"jax_mok": 80_000, "jax_mok_fp8_block": 100_000, "jax_mok_mxfp8": 100_000,
                    "jax_mok_fp8_block_prepared": 100_000, "reference": 80_000,
                    "padded": 200_000}
DEFAULT_VARIANTS = ("jax_mok,jax_mok_fp8_block,jax_mok_mxfp8,jax_mok_fp8_block_prepared,"
                    "padded,reference")
TINY_SEQ = 32


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--layers", default="auto",
                   help="transformer blocks, or 'auto': as many as the memory estimate fits, "
                        "at most 8 (2 on a CPU)")
    p.add_argument("--seq", type=int, default=None,
                   help=f"sequence length (default 4096; {TINY_SEQ} with --tiny)")
    p.add_argument("--batch", type=int, default=8,
                   help="sequences per micro-batch per device (--micro-batches per step)")
    p.add_argument("--micro-batches", type=int, default=1,
                   help="micro-batches per optimizer step: their gradients are summed over a "
                        "lax.scan and averaged before one update; the prepared FP8 variant "
                        "quantizes its expert weights once per step for all of them")
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help="comma-separated, from: jax_mok, jax_mok_fp8_block, jax_mok_mxfp8, "
                        "jax_mok_fp8_block_prepared, reference, padded")
    p.add_argument("--expert-parallel", action="store_true",
                   help="mesh ('data', 'expert') = (1, all local devices): experts sharded, "
                        "batch per device (the padded variant is skipped)")
    p.add_argument("--attention", choices=("auto", "cudnn", "xla"), default="auto",
                   help="dot_product_attention implementation (auto: cudnn on a GPU)")
    p.add_argument("--remat", action="store_true", help="rematerialise each block")
    p.add_argument("--padded-margin", type=float, default=1.1,
                   help="padded variant: capacity = margin x the largest expert count measured "
                        "on the first batch, rounded up to 8; later overflow is dropped and "
                        "reported")
    p.add_argument("--oom-retries", type=int, default=1,
                   help="--batch-policy fixed: halvings of a variant's batch on OOM")
    p.add_argument("--batch-policy", choices=("fixed", "shared"), default="fixed",
                   help="fixed: every variant at --batch (each halved on OOM, --oom-retries); "
                        "shared: the largest batch (from --batch, halving on OOM) at which "
                        "--batch-anchor runs, then every other variant at that batch (a "
                        "variant that fails there gets its row with the error)")
    p.add_argument("--batch-anchor", default="padded",
                   help="--batch-policy shared: the variant whose largest batch is shared")
    p.add_argument("--own-best", action="store_true",
                   help="--batch-policy shared: also run jax_mok and its FP8 variants at "
                        "doubling batches until OOM (rows '<variant> (own best batch)')")
    p.add_argument("--own-best-variants", default=None,
                   help="--own-best: which variants (default: every jax_mok variant run)")
    p.add_argument("--own-best-cap", type=int, default=64,
                   help="--own-best: the largest batch per device tried")
    p.add_argument("--own-best-min-gain", type=float, default=0.03,
                   help="--own-best: stop doubling when tokens/s gains less than this")
    p.add_argument("--max-step-s", type=float, default=0,
                   help="a variant whose first step takes longer gets status too_slow "
                        "(0: no limit)")
    p.add_argument("--breakdown", action="store_true",
                   help="after the timed steps, profile --profile-steps steps: the step time "
                        "of the MoE layers vs the rest (differential measurement if the "
                        "profile cannot be read)")
    p.add_argument("--profile-steps", type=int, default=3, help="--breakdown: profiled steps")
    p.add_argument("--keep-profile", action="store_true",
                   help="--breakdown: keep the traces under OUT/profile/<variant>")
    p.add_argument("--tiny", action="store_true",
                   help="tiny dims for a CPU smoke run (H=64, F=32, E=8, k=2, 2 layers, seq "
                        f"{TINY_SEQ})")
    p.add_argument("--out", default="e2e-out", help="output directory")
    args = p.parse_args(argv)
    if args.micro_batches < 1:
        p.error(f"--micro-batches must be >= 1, got {args.micro_batches}")
    if args.own_best and args.batch_policy != "shared":
        p.error("--own-best needs --batch-policy shared")
    if args.seq is None:
        args.seq = TINY_SEQ if args.tiny else 4096
    return args


def _is_oom(err: Exception) -> bool:
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def _auto_attention(platform: str) -> str | None:
    """cuDNN flash attention on a GPU; elsewhere JAX's default (XLA)."""
    return "cudnn" if platform == "gpu" else None


def auto_layers(cfg, variants, tokens, device) -> int:
    """Most layers (<= 8) whose estimated training memory fits 90 % of the device's."""
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit")
    if device.platform != "gpu" or not limit:
        return 2
    one = cfg.__class__(**{**cfg.__dict__, "layers": 1})
    fixed = 18 * 2 * cfg.vocab * cfg.hidden + 10 * tokens * cfg.vocab  # embed/head, logits
    per_layer_params = one.param_count() - 2 * cfg.vocab * cfg.hidden
    # The reference variant is left out when others run: where its ragged_dot does not fit,
    # it is retried at a smaller batch rather than shrinking every variant's model.
    sized = [v for v in variants if v != "reference"] or variants
    act = max(ACTIVATION_BYTES[v] for v in sized)
    per_layer = 18 * per_layer_params + act * tokens  # f32 param, grad, 2 moments + bf16 copy
    layers = int((0.9 * limit - fixed) // per_layer)
    log(f"memory estimate: {per_layer / GIB:.1f} GiB per layer, {fixed / GIB:.1f} GiB fixed, "
        f"limit {limit / GIB:.1f} GiB -> {max(1, min(8, layers))} layers")
    return max(1, min(8, layers))


def run_variant(variant, cfg, args, batch, mesh, attention, ceiling, n_devices):
    """Builds, compiles and times one variant; returns its record."""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from benchmarks.e2e import model as m
    from benchmarks.peers_jax import b2_capacity
    from benchmarks.timing import summarize, time_steps
    from jax_mok.optim import weight_decay_mask

    base_cfg, cfg = cfg, m.variant_config(variant, cfg)
    prepared = variant in m.PREPARED
    micro = args.micro_batches
    record = {"variant": variant, "text": m.VARIANT_TEXT[variant], "batch": batch,
              "micro_batches": micro, "quantization": cfg.quantization,
              "fp8_weights_per_step": prepared}
    if variant == "jax_mok" or cfg.quantization is not None:
        from jax_mok import api

        record["implementation"] = api.default_implementation(jnp.bfloat16, cfg.moe_config())
        if record["implementation"] == "reference" and cfg.quantization is None:
            # (the FP8 variants' record["fp8_path"] says what runs them)
            log(f"{variant}: WARNING: the kernels are not built for this backend, so this "
                "variant runs the reference path (build with nvcc on PATH: pip install -e .)")
    moe_fn = m.moe_fn_for(variant, mesh)
    t0 = time.perf_counter()
    # Built under jit: one compiled initialiser instead of an eager dispatch per weight.
    model = nnx.jit(lambda: m.MoETransformer(cfg, moe_fn, attention=attention, remat=args.remat,
                                             rngs=nnx.Rngs(0)))()
    tx = optax.adamw(1e-4, weight_decay=0.1,
                     mask=functools.partial(weight_decay_mask, exclude_vectors=True))
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    graphdef, state = nnx.split((model, opt))
    del model, opt
    global_batch = batch * n_devices
    rng = np.random.default_rng(0)
    # [micro, global_batch, seq + 1] per step, or [global_batch, seq + 1] for one micro-batch
    lead = (micro,) if micro > 1 else ()
    batches = [rng.integers(0, cfg.vocab, (*lead, global_batch, cfg.seq + 1), dtype=np.int32)
               for _ in range(2)]
    if mesh is not None:
        def place(path, leaf):
            names = {getattr(k, "key", getattr(k, "name", None)) for k in path}
            expert = names & {"w_gate_up", "w_down"} and getattr(leaf, "ndim", 0) == 4
            return NamedSharding(mesh, P(None, "expert") if expert else P())

        state = jax.device_put(state, jax.tree_util.tree_map_with_path(place, state))
        spec = P(*(None,) * len(lead), ("data", "expert"))
        batches = [jax.device_put(b, NamedSharding(mesh, spec)) for b in batches]
    else:
        batches = [jax.device_put(b) for b in batches]
    log(f"{variant}: model built in {time.perf_counter() - t0:.1f} s")

    if variant == "padded":  # size the padded buffers from the first batch's routing
        probe = nnx.merge(graphdef, state)[0]
        first = batches[0][0] if micro > 1 else batches[0]
        _, aux = nnx.jit(lambda model, t: model(t))(probe, first[:, :-1])
        largest = int(np.asarray(aux["expert_counts"]).max())
        moe_fn.capacity = b2_capacity(math.ceil(args.padded_margin * largest))
        record["capacity"] = moe_fn.capacity
        log(f"padded: largest expert count {largest} -> capacity {moe_fn.capacity}")
        del probe, aux

    def make_train_step(graphdef, prepared):
        def train_step(state, tokens):
            model, opt = nnx.merge(graphdef, state)
            # Once per optimizer step, outside the gradient and shared by its micro-batches:
            # the FP8 expert weights of the step's parameters.
            fp8_weights = m.prepare_fp8_weights(model) if prepared else None
            if micro == 1:
                grad_fn = nnx.value_and_grad(m.loss_fn, has_aux=True)
                (loss, metrics), grads = grad_fn(model, tokens, cfg.aux_loss_weight,
                                                 fp8_weights)
                dropped = metrics["dropped"].sum()
            else:
                loss, grads, dropped = m.accumulated_value_and_grad(
                    model, tokens, cfg.aux_loss_weight, fp8_weights)
            opt.update(model, grads)
            return nnx.state((model, opt)), loss, dropped

        return train_step

    step = jax.jit(make_train_step(graphdef, prepared), donate_argnums=0)
    t0 = time.perf_counter()
    log(f"{variant}: compiling ({micro} x {global_batch} x {cfg.seq} tokens per step)")
    lowered = step.lower(state, batches[0])
    if cfg.quantization is not None:
        from benchmarks import mok_internals

        targets = mok_internals.fp8_kernel_targets(lowered.as_text())
        record["fp8_path"] = ("kernels: " + ", ".join(targets) if targets
                              else "pure-jax" + (" (the FP8 layer's CPU backend)"
                                                 if jax.default_backend() == "cpu" else ""))
        if not targets and jax.default_backend() != "cpu":
            log(f"{variant}: WARNING: the step calls no FP8 kernel (mok_*fp8*): the FP8 layer "
                "runs its pure-JAX definition")
        log(f"{variant}: FP8 path {record['fp8_path']}")
    compiled = lowered.compile()
    record["compile_s"] = time.perf_counter() - t0
    log(f"{variant}: compiled in {record['compile_s']:.1f} s")
    outputs = []  # (loss, dropped) of every step, warm-ups first

    def step(i: int) -> None:
        nonlocal state
        _before_step(variant, batch)
        t_step = time.perf_counter()
        state, loss, drop = compiled(state, batches[i % 2])
        jax.block_until_ready((state, loss))
        outputs.append((loss, drop))
        if len(outputs) == 1 and args.max_step_s and (
                elapsed := time.perf_counter() - t_step) > args.max_step_s:
            raise TooSlow(f"the first step took {elapsed:.1f} s (over --max-step-s "
                          f"{args.max_step_s:g}); not timed")

    log(f"{variant}: {args.warmup} warm-up and {args.steps} timed steps")
    stats = summarize(time_steps(step, warmup=args.warmup, iters=args.steps))
    losses = [float(loss) for loss, _ in outputs]
    dropped = sum(int(drop) for _, drop in outputs[args.warmup:])
    for i, ms in enumerate(stats["times_ms"]):
        log(f"{variant}: timed step {i + 1}/{args.steps} {ms:.1f} ms, loss "
            f"{losses[args.warmup + i]:.4f}")
    tokens = micro * global_batch * cfg.seq
    record.update(
        status="ok", step_ms=stats["times_ms"], step_ms_median=stats["median_ms"],
        tokens_per_s=tokens / (stats["median_ms"] * 1e-3), losses=losses,
        final_loss=losses[-1],
        dropped_fraction=dropped / (args.steps * tokens * cfg.top_k * cfg.layers))
    # Every variant: the BF16 model's FLOPs (an FP8 GEMM counts as its BF16 FLOPs) over the BF16
    # matmul ceiling of this run, so MFUs compare as tokens/s do.
    record["flops_per_token"] = base_cfg.flops_per_token()["train"]
    record["mfu"] = record["tokens_per_s"] * record["flops_per_token"] / (
        ceiling * 1e12 * n_devices)
    log(f"{variant}: median {record['step_ms_median']:.1f} ms, "
        f"{record['tokens_per_s']:,.0f} tokens/s, MFU {100 * record['mfu']:.1f} %")
    if args.breakdown:
        def run_steps(executable, n):
            nonlocal state
            for i in range(n):
                state, loss, _ = executable(state, batches[i % 2])
                jax.block_until_ready((state, loss))

        def identity_step_ms():
            """Median step of the same model with identity MoE layers (the differential)."""
            nonlocal state
            state = None  # the variant's state is not needed any more: make room
            gc.collect()
            model = nnx.jit(lambda: m.MoETransformer(
                cfg, moe_fn, attention=attention, remat=args.remat, rngs=nnx.Rngs(0),
                identity_moe=True))()
            opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
            id_graphdef, id_state = nnx.split((model, opt))
            del model, opt
            if mesh is not None:
                id_state = jax.device_put(id_state,
                                          jax.tree_util.tree_map_with_path(place, id_state))
            id_step = jax.jit(make_train_step(id_graphdef, False), donate_argnums=0)
            id_compiled = id_step.lower(id_state, batches[0]).compile()

            def one(i):
                nonlocal id_state
                id_state, loss, _ = id_compiled(id_state, batches[i % 2])
                jax.block_until_ready((id_state, loss))

            return summarize(time_steps(one, warmup=max(1, args.warmup),
                                        iters=args.steps))["median_ms"]

        record["breakdown"] = measure_breakdown(variant, lowered, compiled, run_steps,
                                                identity_step_ms, record["step_ms_median"],
                                                args)
    return record


class TooSlow(RuntimeError):
    """A variant's first step took longer than ``--max-step-s``."""


def _before_step(variant: str, batch: int) -> None:
    """Called before every timed or warm-up step of a variant (a hook for the tests, which make
    it raise the error XLA raises when a step runs out of device memory)."""


def measure_breakdown(variant, lowered, compiled, run_steps, identity_step_ms, step_ms,
                      args) -> dict:
    """The step-time breakdown (MoE layers vs the rest) of one variant; never raises (a failure
    is recorded). See benchmarks/e2e/breakdown.py."""
    import shutil
    import tempfile

    import jax

    from benchmarks.e2e import breakdown

    note = None
    try:
        executable = compiled
        import re

        flag = re.search(r"--xla_gpu_enable_command_buffer=(\S*)", os.environ.get("XLA_FLAGS", ""))
        if flag and flag.group(1).strip("'\"") == "":
            note = "profiled the timed executable (XLA_FLAGS: command buffers off for the run)"
        elif jax.default_backend() == "gpu":
            # Kernels inside a command buffer carry its name, not their op's: profile an
            # executable compiled without command buffers (the timed steps kept the default).
            try:
                executable = lowered.compile(
                    compiler_options={"xla_gpu_enable_command_buffer": ""})
                note = "profiled executable compiled with xla_gpu_enable_command_buffer=''"
            except Exception as err:  # noqa: BLE001 - recorded
                note = ("profiled the default executable (recompiling without command buffers "
                        f"failed: {str(err).splitlines()[0][:200]})")
        if args.keep_profile:
            trace_dir = str(pathlib.Path(args.out) / "profile" / variant)
        else:
            trace_dir = tempfile.mkdtemp(prefix=f"e2e-profile-{variant}-")
        run_steps(executable, 1)  # warm the (new) executable outside the trace
        jax.profiler.start_trace(trace_dir)
        try:
            run_steps(executable, args.profile_steps)
        finally:
            jax.profiler.stop_trace()
        hlo = executable.as_text()
        module = hlo.split(",", 1)[0].split()[1] if hlo.startswith("HloModule") else None
        try:
            record = breakdown.from_profile(trace_dir, hlo, module, args.profile_steps, step_ms)
        finally:
            if not args.keep_profile:
                shutil.rmtree(trace_dir, ignore_errors=True)
        if record["moe_ops"] == 0:
            raise ValueError("the profile has no op of the MoE layers (no mok_* custom call, "
                             f"no '{breakdown.MOE_SCOPE}' scope in the ops' metadata)")
        if args.keep_profile:
            record["trace_dir"] = trace_dir
        if note:
            record["note"] = note
        log(f"{variant}: breakdown (profile of {args.profile_steps} steps): MoE "
            f"{record['moe_ms']:.1f} ms ({100 * record['moe_fraction']:.0f} %), rest "
            f"{record['rest_ms']:.1f} ms of the {step_ms:.1f} ms step")
        return record
    except Exception as err:  # noqa: BLE001 - falls back to the differential measurement
        reason = f"profile not usable: {type(err).__name__}: {str(err).splitlines()[0][:300]}"
        log(f"{variant}: {reason}; measuring the step with identity MoE layers instead")
    try:
        record = breakdown.differential(step_ms, identity_step_ms(), reason)
        log(f"{variant}: breakdown (DIFFERENTIAL, not a profile): MoE {record['moe_ms']:.1f} "
            f"ms, rest {record['rest_ms']:.1f} ms of the {step_ms:.1f} ms step")
        return record
    except Exception as err:  # noqa: BLE001 - recorded
        log(f"{variant}: breakdown failed: {str(err).splitlines()[0][:300]}")
        return {"method": "failed", "reason": reason,
                "error": f"{type(err).__name__}: {str(err).splitlines()[0][:1000]}"}


OWN_BEST_SUFFIX = " (own best batch)"


def shared_batch_search(args, variants, attempt, result, summary, out) -> int:
    """``--batch-policy shared``: the anchor variant (the padded einsum by default) from
    ``--batch`` down, halving on out-of-memory, to the largest batch at which it runs; every
    attempt is recorded. Returns that batch (the last one tried if it never ran)."""
    from benchmarks.e2e import report

    anchor = args.batch_anchor
    attempts, batch = [], args.batch
    log(f"batch search: the largest batch per device at which {anchor} runs, from {batch}")
    while True:
        record = attempt(anchor, batch)
        attempts.append(summary(record))
        if record["status"] == "oom" and batch > 1:
            log(f"batch search: {anchor} out of memory at batch {batch}; trying {batch // 2}")
            batch //= 2
            continue
        break
    record["batch_attempts"] = attempts
    record["oom_batches"] = [a["batch"] for a in attempts if a["status"] == "oom"]
    record["at_shared_batch"] = True
    result["variants"][anchor] = record
    result["batch"] = batch
    result["batch_search"] = {"policy": "shared", "anchor": anchor, "start": args.batch,
                              "shared_batch": batch, "anchor_status": record["status"],
                              "attempts": attempts}
    if record["status"] != "ok":
        log(f"batch search: {anchor} did not run at any batch ({record['status']}); every "
            f"variant runs at batch {batch}")
    else:
        log(f"batch search: shared batch {batch} per device")
    gc.collect()
    report.write_json(result, out)
    return batch


def own_best(variant, args, attempt, result, summary, out) -> None:
    """``--own-best``: ``variant`` at doubling batches from the shared one until it runs out of
    memory, reaches ``--own-best-cap`` or gains under ``--own-best-min-gain`` in tokens/s; its
    fastest run becomes the row ``<variant> (own best batch)``."""
    from benchmarks.e2e import report

    base = result["variants"].get(variant)
    if not base or base.get("status") != "ok":
        log(f"{variant}: no own-best search (it did not run at the shared batch)")
        return
    shared = base["batch"]
    best, attempts, batch = base, [summary(base)], 2 * shared
    stop = f"cap {args.own_best_cap}"
    while batch <= args.own_best_cap:
        log(f"{variant}: own best batch: trying {batch}")
        record = attempt(variant, batch, args)
        attempts.append(summary(record))
        gc.collect()
        if record["status"] != "ok":
            stop = f"{record['status']} at batch {batch}"
            break
        gain = record["tokens_per_s"] / best["tokens_per_s"] - 1
        if gain > 0:
            best = record
        if gain < args.own_best_min_gain:
            stop = f"tokens/s gain {100 * gain:.1f} % at batch {batch}"
            break
        batch *= 2
    row = dict(best)
    row.update(own_best=True, shared_batch=shared, batch_attempts=attempts, own_best_stop=stop,
               oom_batches=[a["batch"] for a in attempts if a["status"] == "oom"])
    row.pop("at_shared_batch", None)
    result["variants"][variant + OWN_BEST_SUFFIX] = row
    log(f"{variant}: own best batch {row['batch']} ({row['tokens_per_s']:,.0f} tokens/s; "
        f"stopped: {stop})")
    report.write_json(result, out)


def main(argv=None) -> dict:
    log("starting: importing JAX")
    args = parse_args(argv)
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    import dataclasses

    import jax

    from benchmarks import ceilings
    from benchmarks.e2e import model as m
    from benchmarks.e2e import report

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in m.VARIANTS:
            raise SystemExit(f"--variants: {v!r} is not one of {m.VARIANTS}")
    devices = jax.local_devices()
    platform = devices[0].platform
    log(f"{len(devices)} x {devices[0].device_kind} ({platform}), jax {jax.__version__}")
    mesh = None
    if args.expert_parallel:
        from jax.sharding import AxisType

        mesh = jax.make_mesh((1, len(devices)), ("data", "expert"),
                             axis_types=(AxisType.Auto, AxisType.Auto))
        if "padded" in variants:
            log("padded: skipped under --expert-parallel (single-device form only)")
            variants.remove("padded")
    if args.batch_policy == "shared" and args.batch_anchor not in variants:
        raise SystemExit(f"--batch-policy shared: the anchor {args.batch_anchor!r} "
                         f"(--batch-anchor) is not among the variants run {variants}")
    n_devices = len(devices) if mesh is not None else 1
    cfg = m.ModelConfig(seq=args.seq)
    if args.tiny:
        cfg = m.ModelConfig(layers=2, hidden=64, ffn=32, experts=8, top_k=2, heads=4,
                            kv_heads=2, head_dim=16, vocab=256, seq=args.seq)
    layers = (auto_layers(cfg, variants, args.batch * cfg.seq, devices[0])
              if args.layers == "auto" else int(args.layers))
    cfg = dataclasses.replace(cfg, layers=layers)
    attention = {"auto": _auto_attention(platform), "cudnn": "cudnn",
                 "xla": "xla"}[args.attention]
    log("measuring the bf16 matmul ceiling")
    ceiling = ceilings.measure(platform=platform, quick=platform != "gpu", warmup=2, iters=5)
    log(f"ceiling {ceiling['matmul_tflops']:.1f} TFLOP/s")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import flax

    result = {
        "command": "python -m benchmarks.e2e.run " + shlex.join(sys.argv[1:] if argv is None
                                                               else argv),
        "commit": git_commit() or "unknown",
        "machine": {"devices": n_devices, "device_kind": devices[0].device_kind,
                    "platform": platform, "jax": jax.__version__, "flax": flax.__version__},
        "config": dataclasses.asdict(cfg), "batch": args.batch,
        "batch_policy": args.batch_policy, "breakdown": args.breakdown, "steps": args.steps,
        "warmup": args.warmup, "expert_parallel": mesh is not None,
        "attention": attention or "xla", "params": cfg.param_count(),
        "flops": cfg.flops_per_token(), "flops_per_token": cfg.flops_per_token()["train"],
        "ceiling_tflops": ceiling["matmul_tflops"], "ceiling": ceiling, "variants": {},
    }
    log(f"{layers} layers, {cfg.param_count() / 1e9:.2f} B parameters, "
        f"{result['flops_per_token'] / 1e9:.2f} GFLOP per token per training step")
    state = {"attention": attention}

    def attempt(variant: str, batch: int, run_args=None) -> dict:
        """One run of ``variant`` at ``batch``: its record, or a failed one (status oom, error
        or too_slow, with the error); switches to XLA attention if cuDNN's fails."""
        while True:
            try:
                return run_variant(variant, cfg, run_args or args, batch, mesh,
                                   state["attention"],
                                   ceiling["matmul_tflops"], n_devices)
            except Exception as err:  # noqa: BLE001 - reported in the results, not hidden
                gc.collect()
                if (state["attention"] == "cudnn" and args.attention == "auto"
                        and not _is_oom(err)
                        and ("cudnn" in str(err).lower() or "attention" in str(err).lower())):
                    log(f"{variant}: cuDNN attention failed ({str(err).splitlines()[0][:200]}); "
                        "falling back to attention 'xla' for this and later variants")
                    state["attention"] = "xla"
                    result["attention"] = "xla (cuDNN failed)"
                    continue
                status = ("oom" if _is_oom(err) else
                          "too_slow" if isinstance(err, TooSlow) else "error")
                first = str(err).splitlines()[0] if str(err) else type(err).__name__
                log(f"{variant}: {status} at batch {batch}: {first[:300]}")
                return {"variant": variant, "text": m.VARIANT_TEXT[variant], "status": status,
                        "batch": batch, "error": first[:2000],
                        "error_type": type(err).__name__}

    def skip(variant: str, batch: int) -> bool:
        reason = m.unavailable_reason(variant)
        if reason is not None:
            log(f"{variant}: skipped: {reason}")
            result["variants"][variant] = {"variant": variant, "text": m.VARIANT_TEXT[variant],
                                           "status": "skipped", "batch": batch,
                                           "error": reason}
            report.write_json(result, out)
        return reason is not None

    def summary(record: dict) -> dict:
        keep = ("batch", "status", "tokens_per_s", "step_ms_median", "error")
        return {k: record[k] for k in keep if k in record}

    if args.batch_policy == "fixed":
        for variant in variants:
            if skip(variant, args.batch):
                continue
            batch, ooms = args.batch, []
            while True:
                record = attempt(variant, batch)
                if (record["status"] == "oom" and len(ooms) < args.oom_retries
                        and batch > 1):
                    ooms.append(batch)
                    log(f"{variant}: out of memory at batch {batch}; retrying at {batch // 2}")
                    batch //= 2
                    continue
                break
            record["oom_batches"] = ooms
            result["variants"][variant] = record
            gc.collect()
            report.write_json(result, out)
    else:
        shared = shared_batch_search(args, variants, attempt, result, summary, out)
        for variant in variants:
            if variant == args.batch_anchor or skip(variant, shared):
                continue
            record = attempt(variant, shared)
            record["oom_batches"] = [shared] if record["status"] == "oom" else []
            record["at_shared_batch"] = True
            result["variants"][variant] = record
            gc.collect()
            report.write_json(result, out)
        result["variants"] = {v: result["variants"][v] for v in variants}
        if args.own_best:
            chosen = ([v.strip() for v in args.own_best_variants.split(",") if v.strip()]
                      if args.own_best_variants else
                      [v for v in variants if v == "jax_mok" or v in m.QUANTIZATION])
            # The search's runs are not profiled (the breakdown is of the shared-batch rows).
            search_args = argparse.Namespace(**{**vars(args), "breakdown": False})
            for variant in [v for v in variants if v in chosen]:
                own_best(variant, search_args, attempt, result, summary, out)
    for record in result["variants"].values():
        # FP8 rows against jax_mok's (BF16) row of the same batch policy (own best: own best)
        baseline = result["variants"].get(
            "jax_mok" + (OWN_BEST_SUFFIX if record.get("own_best") else ""), {})
        if (record.get("quantization") and record["status"] == "ok"
                and baseline.get("status") == "ok"):
            record["tokens_per_s_vs_jax_mok"] = (record["tokens_per_s"]
                                                 / baseline["tokens_per_s"])
    report.write_json(result, out)
    report.write_markdown(result, out)
    plot = report.write_plot(result, out)
    log(f"wrote {out / 'e2e.json'}, {out / 'e2e.md'}" + (f", {plot}" if plot else ""))
    print(report.markdown(result), flush=True)
    return result


if __name__ == "__main__":
    main()
