"""mxfp8 on the kernels, the two GEMM paths side by side with our BF16: the promoted FP8 wgmma
(``mx_gemm="fp8"``) and the BF16 GEMMs on exactly dequantized operands (``mx_gemm="bf16"``),
from master weights and with ``fp8_weights`` prepared, forward and forward+backward, wall-clock
medians on one GPU (weight gradients unquantized in both: the BF16 path's only mode).

    python tools/mx_ab.py [--shapes S1,S2,S3,S6] [--iters 10]

Prints one row per (shape, variant) and a table last; ratio = our BF16 time / the variant's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, __file__.rsplit("/tools/", 1)[0])
from benchmarks.problems import make_problem  # noqa: E402
from benchmarks.timing import time_steps  # noqa: E402
from jax_mok import testing  # noqa: E402
from jax_mok.kernels import _ffi, autodiff  # noqa: E402
from jax_mok.quantization import cuda as fp8_cuda  # noqa: E402
from jax_mok.quantization.weights import Fp8Weights, quantize_expert_weight  # noqa: E402


def _variants():
    def bf16(x, ids, w, wgu, wd, prepared):
        return autodiff.routed_experts(x, ids, w, wgu, wd, implementation="cuda")

    def mx(gemm):
        def f(x, ids, w, wgu, wd, prepared):
            return fp8_cuda.routed_experts_fp8(x, ids, w, wgu, wd, "mxfp8", implementation="cuda",
                                               weight_grads="unquantized", prepared=prepared,
                                               mx_gemm=gemm)
        return f

    return {"bf16": (bf16, False), "mx fp8": (mx("fp8"), False), "mx bf16": (mx("bf16"), False),
            "mx bf16 prepared": (mx("bf16"), True), "mx fp8 prepared": (mx("fp8"), True)}


def _prepare(wgu, wd, variant):
    """The variant's prepared weights: MxBf16Weights for the BF16 path, Fp8Weights else."""
    if "bf16" in variant:
        return fp8_cuda.mx_bf16_weights(wgu, wd)
    gu, gu_t = quantize_expert_weight(wgu, "mxfp8", True, True)
    dn, dn_t = quantize_expert_weight(wd, "mxfp8", True, True)
    return Fp8Weights(gu, dn, gu_t, dn_t, "mxfp8", "bfloat16")


def _time_variant(name, variant, fn, sets, prepared, args) -> dict:
    """Median ms of the forward and of forward+backward (vjp with the set's dy) of ``fn``."""
    fwd = jax.jit(fn)

    @jax.jit
    def fwdbwd(x, ids, w, wgu, wd, pw, dy):
        y, vjp = jax.vjp(lambda x, w, wgu, wd: fn(x, ids, w, wgu, wd, pw), x, w, wgu, wd)
        return y, vjp(dy)

    result = {}
    for pass_name in ("fwd", "fwdbwd"):
        def step(i, pass_name=pass_name):
            s = sets[i % len(sets)]
            pw = None if prepared is None else prepared[i % len(sets)]
            out = fwd(*s.args(), pw) if pass_name == "fwd" else fwdbwd(*s.args(), pw, s.dy)
            jax.block_until_ready(out)

        try:
            t0 = time.perf_counter()
            step(0)  # compile
            compile_s = time.perf_counter() - t0
            samples = time_steps(step, warmup=args.warmup, iters=args.iters)
            result[pass_name] = statistics.median(samples) * 1e3
            print(f"{name} {variant:17s} {pass_name:7s} {result[pass_name]:8.3f} ms "
                  f"(first call {compile_s:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - a variant's failure is a row, not an end
            result[pass_name] = None
            print(f"{name} {variant:17s} {pass_name:7s} FAILED: {e!r}"[:400], flush=True)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="S1,S2,S3,S6")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    if not _ffi.kernels_built("cuda"):  # also registers the CUDA targets with XLA
        raise SystemExit("mx_ab: jax_mok._mok_cuda is not built")
    rows = []
    for name in args.shapes.split(","):
        shape = testing.SHAPES[name]
        problem = make_problem(shape, "balanced", num_sets=2)
        sets = problem.sets
        for variant, (fn, use_prepared) in _variants().items():
            prepared = None
            if use_prepared:  # made before timing, freed after the variant (memory)
                prepared = [_prepare(s.w_gate_up, s.w_down, variant) for s in sets]
                jax.block_until_ready(prepared)
            result = _time_variant(name, variant, fn, sets, prepared, args)
            del prepared
            rows.append((name, variant, result))
    print("\n| shape | variant | fwd ms (BF16 / this) | fwd+bwd ms (BF16 / this) |")
    print("|---|---|---|---|")
    base = {(n, k): r[k] for n, v, r in rows if v == "bf16" for k in r}
    for name, variant, result in rows:
        cells = []
        for k in ("fwd", "fwdbwd"):
            t, b = result.get(k), base.get((name, k))
            cells.append("–" if t is None else
                         f"{t:.3f}" + (f" ({b / t:.2f}×)" if b and variant != "bf16" else ""))
        print(f"| {name} | {variant} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    jnp.zeros(1).block_until_ready()
    sys.exit(main())
