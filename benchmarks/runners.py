"""How one item of each family runs: check against the reference first, then time.

``run_jax`` (jax_mok, its FP8 rows, B1, B2), ``run_torch`` (B3, B3-fp8) and ``run_liger`` (B6)
each fill a record prepared by ``worker.ShapeRunner`` (which owns the problems, probes and
reference outputs, the check and the timing). A reason an item cannot run here becomes status
"unavailable" (or "unsupported" for a pass the peer does not have) with that reason.
"""

from __future__ import annotations

import functools
import time

from benchmarks.impls import FP8_TOLERANCE, IMPLS, tolerances
from jax_mok import tuning


def _tolerances(sr, name: str) -> dict | None:
    return tolerances(name, sr.spec.get("fp8_tolerance", FP8_TOLERANCE))


def _unavailable(record: dict, reason: str, status: str = "unavailable") -> None:
    record["status"] = status
    record["reason"] = reason


def run_jax(sr, item: dict, problem, want: dict, record: dict) -> None:
    """A JAX implementation: jit, one checked call on set 0, then the timed calls."""
    import jax

    from benchmarks import mok_internals, peers_jax, problems

    impl = IMPLS[item["impl"]]
    if impl.name.startswith("jax_mok") and not mok_internals.kernels_built(sr.platform):
        return _unavailable(record, f"jax_mok kernels for {sr.platform} are not built")
    capacity = None
    if impl.name == "B2":
        capacity = peers_jax.b2_capacity(problem.max_count)
        record["b2_capacity"] = capacity
    fn = peers_jax.routed_fn(impl.name, capacity=capacity)
    make = peers_jax.forward_fn if item["pass"] == "fwd" else peers_jax.forward_backward_fn
    jitted = make(fn, prepared=impl.prepared)
    probe = sr.probes[item["routing"]]
    s0 = problem.sets[0]
    # Lowered once, before anything is quantized (pre-quantized weights as their shapes): the FP8
    # rows' path is decided on it, and it is the program compiled and timed below.
    weights0 = (s0.w_gate_up, s0.w_down)
    if impl.prequantized:
        weights0 = jax.eval_shape(
            functools.partial(peers_jax.prequantize, recipe=impl.recipe), *weights0)
    elif impl.prepared:
        weights0 = (*weights0, jax.eval_shape(
            functools.partial(peers_jax.prepare, recipe=impl.recipe), *weights0))
    lowered = jitted.lower(s0.x, s0.ids, s0.weights, *weights0, probe.dy_check)
    if impl.precision == "fp8":
        path, reason = peers_jax.fp8_path(lowered, sr.platform)
        record["fp8_path"] = path
        if reason is not None and not tuning.read("JAX_MOK_BENCH_FP8_PURE_JAX"):
            return _unavailable(record, reason)
    weights = [(s.w_gate_up, s.w_down) for s in problem.sets]
    if impl.prequantized or impl.prepared:
        start = time.perf_counter()
        quantized: dict[int, tuple] = {}  # one copy per distinct weight array
        for s in problem.sets:
            if id(s.w_gate_up) in quantized:
                continue
            if impl.prequantized:
                quantized[id(s.w_gate_up)] = peers_jax.prequantize(s.w_gate_up, s.w_down,
                                                                   impl.recipe)
            else:  # the master weights stay arguments: the gradients are theirs
                quantized[id(s.w_gate_up)] = (s.w_gate_up, s.w_down, peers_jax.prepare(
                    s.w_gate_up, s.w_down, impl.recipe))
        weights = [quantized[id(s.w_gate_up)] for s in problem.sets]
        jax.block_until_ready(weights)
        record["prequantize_s"] = time.perf_counter() - start
        # the FP8 bytes a pass reads per expert (the forward's two layouts; the backward's two
        # are the same size); a prepared row's gradients are still the master weights' dtype
        record["weight_bytes_per_expert"] = peers_jax.quantized_bytes_per_expert(
            weights[0] if impl.prequantized else (weights[0][2].gate_up, weights[0][2].down))

    def args(i: int, dy) -> tuple:
        s = problem.sets[i % len(problem.sets)]
        return (s.x, s.ids, s.weights, *weights[i % len(problem.sets)], dy)

    start = time.perf_counter()
    # Compiled ahead of time so that the program timed below is the one whose buffer assignment
    # is recorded (the FP8 rows' peak device memory: BENCHMARKS protocol).
    compiled = lowered.compile()
    record["program_bytes"] = program_bytes(compiled, args(0, probe.dy_check))
    # Wait for the program itself before reading its outputs: execution is asynchronous, so an
    # allocation failure inside it would otherwise surface in the first eager op that reads
    # them, the probe's slice-and-astype, and be reported as that op's (S4's FP8 fwd+bwd OOM
    # read executable_name='jit_convert_element_type' while the 24 GiB were the program's).
    out = jax.block_until_ready(compiled(*args(0, probe.dy_check)))
    got = (problems.probe_outputs(probe, out) if item["pass"] == "fwd"
           else problems.probe_outputs(probe, *out))
    del out
    record["first_call_s"] = time.perf_counter() - start  # compile + check run
    if not sr.check(got, want, record, _tolerances(sr, impl.name)):
        return

    def step(i: int) -> None:
        s = problem.sets[i % len(problem.sets)]
        jax.block_until_ready(compiled(*args(i, s.dy)))

    sr.timed(step, record)


def program_bytes(compiled, args=None) -> dict | None:
    """Device bytes of a compiled JAX program: its arguments, outputs, temporaries and the peak
    they make together (outputs that alias arguments counted once). Outputs and temporaries are
    XLA's buffer assignment; the arguments are the bytes of ``args`` (the arrays the program is
    called with) where given, XLA's count otherwise (kept as ``arguments_xla``: on the GPU it left
    out the prepared FP8 layouts of the fwd+bwd programs that read them). None where the backend
    gives no memory analysis (JAX's ``memory_analysis`` says so with None)."""
    import jax

    ma = compiled.memory_analysis()
    if ma is None:
        return None
    out = {"arguments_xla": int(ma.argument_size_in_bytes),
           "outputs": int(ma.output_size_in_bytes),
           "aliased": int(ma.alias_size_in_bytes), "temporaries": int(ma.temp_size_in_bytes)}
    out["arguments"] = (out["arguments_xla"] if args is None else
                        sum(int(leaf.nbytes) for leaf in jax.tree.leaves(args)))
    out["peak"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
    return out


def _torch_checked_and_timed(sr, runner, item: dict, want: dict, record: dict,
                             tolerance: dict | None, after_first_call=None) -> None:
    try:
        start = time.perf_counter()
        got = runner.check_outputs(sr.probes[item["routing"]])
        record["first_call_s"] = time.perf_counter() - start
        if after_first_call is not None:
            after_first_call()
        if sr.check(got, want, record, tolerance):
            sr.timed(runner.step(), record)
    finally:
        runner.release()


def run_torch(sr, item: dict, problem, want: dict, record: dict) -> None:
    """B3 and B3-fp8 (PyTorch on the same device, DLPack views of the same arrays)."""
    from benchmarks import peers_torch, peers_torch_fp8

    reason = peers_torch.unavailable_reason(sr.platform)
    if reason is not None:
        return _unavailable(record, reason)
    impl = IMPLS[item["impl"]]
    fn = peers_torch.routed_experts
    if impl.name == "B3-fp8":
        import torch

        reason = peers_torch_fp8.shape_reason(sr.shape.hidden, sr.shape.ffn)
        if reason is not None:
            return _unavailable(record, reason)
        device = "cuda" if sr.platform == "gpu" else "cpu"
        record["b3_fp8_gemm"] = ("torch._scaled_grouped_mm, row-wise scales, use_fast_accum"
                                 if device == "cuda" else
                                 "float32 emulation of torch._scaled_grouped_mm (CPU)")
        record["b3_fp8_row_align"] = peers_torch_fp8.ROW_ALIGN
        if item["pass"] == "fwdbwd":
            reason = peers_torch_fp8.fwdbwd_unsupported_reason(device)
            if reason is not None:
                return _unavailable(record, reason, "unsupported")
        if not hasattr(torch, "float8_e4m3fn"):
            return _unavailable(record, f"torch {torch.__version__} has no float8_e4m3fn")
        fn = peers_torch_fp8.routed_experts
    runner = peers_torch.TorchRunner(problem, item["pass"], fn)
    _torch_checked_and_timed(sr, runner, item, want, record, _tolerances(sr, impl.name))


def run_liger(sr, item: dict, problem, want: dict, record: dict) -> None:
    """B6 (Liger-Kernel's fused MoE; its autotune mode and each kernel's configs recorded beside
    the time: peers_liger's docstring)."""
    from benchmarks import peers_liger as pl

    path = sr.spec.get("b6_configs") or pl.CONFIGS_PATH
    wanted = pl.problem_of(sr.shape, sr.dtype.name)
    plan = pl.select_mode(sr.spec.get("b6_autotune", pl.DEFAULT_MODE),
                          pl.shape_key(sr.spec["shape"], wanted), wanted, sr.spec["passes"],
                          path=path)
    reason = pl.unavailable_reason(sr.platform, plan.mode)
    if reason is not None:
        return _unavailable(record, reason)
    record["liger_kernel"] = pl.liger_version()
    record["triton"] = pl.triton_version()
    start = time.perf_counter()
    runner = pl.LigerRunner(problem, item["pass"])
    record["layout_copy_s"] = time.perf_counter() - start  # untimed: weights in Liger's layout
    tuners = pl.liger_autotuners()
    if plan.mode == "tuned":
        why = pl.pin_recorded(tuners, plan.entry["kernels"])
        if why is not None:
            plan = plan.fall_back(why)
    resumed = {}
    if plan.mode == "record":  # keys already searched on this GPU with these versions
        resumed = pl.prefill(tuners, pl.resumable(plan.key, wanted, sr.machine.get("gpu_name"),
                                                  record["liger_kernel"], record["triton"],
                                                  path=path))
    if plan.warning is not None:
        pl.say_once(plan.warning)
        record["b6_warning"] = plan.warning
    record["b6_mode"] = plan.mode
    record["b6_autotune"] = pl.autotune_setting(plan)
    if resumed:
        record["b6_resumed"] = resumed
        record["b6_autotune"] += ("; resumed: the keys of " + ", ".join(sorted(resumed))
                                  + " launch the winners recorded for this shape on this GPU, "
                                  "only the other keys search")
    pl.say_once(f"B6 {plan.key}: {record['b6_autotune']}")
    before = pl.cache_keys(tuners)
    checkpoint = None
    if plan.mode in pl.SEARCH_MODES and sr.spec.get("b6_checkpoint"):
        # the winners found so far, for the orchestrator should this worker die in the search
        # (a file that stands alone: `peers_liger record` takes it as a results.json)
        base = {**record, "gpu_name": sr.machine.get("gpu_name"),
                "torch": sr.machine.get("torch"), "git_commit": sr.spec.get("git_commit")}
        checkpoint = pl.Checkpoint(sr.spec["b6_checkpoint"], tuners, base, before).start()

    def after_first_call() -> None:  # what each kernel ran with, and which ones searched
        if checkpoint is not None:
            checkpoint.stop()  # no thread beside the check and the timed calls
        record["b6_configs"] = pl.capture(tuners)
        record["b6_searched"] = pl.searched(tuners, before)

    try:
        _torch_checked_and_timed(sr, runner, item, want, record, _tolerances(sr, "B6"),
                                 after_first_call)
    finally:
        if checkpoint is not None:
            checkpoint.close()  # the item's record, whatever its status, supersedes it


RUNNERS = {"jax": run_jax, "torch": run_torch, "liger": run_liger}
