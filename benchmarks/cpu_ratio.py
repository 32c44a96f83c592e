"""Issue 2's CPU target: jax_mok's FFI CPU kernels vs ``jax_mok.reference`` on XLA:CPU.

Forward+backward (the vjp with a random cotangent, as in the harness) at T=4096, H=1024, F=512,
E=32, k=4 in float32 and bfloat16; both outputs are checked against the float32 reference on a
probe before timing. Prints the median times and reference time / jax_mok time (target >= 3).

  python -m benchmarks.cpu_ratio [--iters 3] [--warmup 1] [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

TARGET = 3.0


def measure(dtype_name: str, iters: int, warmup: int, tokens: int = 4096) -> dict:
    """Median seconds of jax_mok and the reference for one dtype, and their ratio."""
    import jax
    import jax.numpy as jnp

    from benchmarks import peers_jax, problems
    from benchmarks.timing import summarize, time_steps
    from jax_mok import testing

    shape = testing.Shape("issue-2", "CPU ratio", tokens, 1024, 512, 32, 4)
    dtype = jnp.dtype(dtype_name)
    problem = problems.make_problem(shape, "balanced", dtype=dtype, num_sets=2)
    probe = problems.make_probe(problem, num_tokens=32)
    want = problems.reference_probe(problem, probe)
    result = {"dtype": dtype.name}
    for impl in ("jax_mok", "B1"):
        step_fn = peers_jax.forward_backward_fn(peers_jax.routed_fn(impl))
        start = time.perf_counter()
        got = problems.probe_outputs(probe, *step_fn(*problem.sets[0].args(), probe.dy_check))
        check = problems.compare(got, want, dtype)
        print(f"  {dtype.name:8s} {impl:7s} first call {time.perf_counter() - start:6.1f} s, "
              f"check max rel. error {check['max_error']:.1e} "
              f"({'ok' if check['passed'] else 'FAILED'})", flush=True)

        def step(i: int, step_fn=step_fn) -> None:
            s = problem.sets[i % len(problem.sets)]
            jax.block_until_ready(step_fn(*s.args(), s.dy))

        stats = summarize(time_steps(step, warmup=warmup, iters=iters))
        print(f"  {dtype.name:8s} {impl:7s} median {stats['median_ms'] / 1e3:7.2f} s  "
              f"(samples {', '.join(f'{t / 1e3:.2f}' for t in stats['times_ms'])} s)", flush=True)
        result[impl] = {**stats, "check": check}
    result["ratio"] = result["B1"]["median_ms"] / result["jax_mok"]["median_ms"]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_ratio", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--tokens", type=int, default=4096, help="T (issue 2 fixes 4096)")
    args = p.parse_args(argv)
    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs; "
          f"fwd+bwd T={args.tokens} H=1024 F=512 E=32 k=4; jax_mok = FFI CPU kernels, "
          f"B1 = jax_mok.reference (ragged_dot) on XLA:CPU", flush=True)
    results = [measure(d.strip(), args.iters, args.warmup, args.tokens)
               for d in args.dtypes.split(",") if d.strip()]
    print("\n| dtype | jax_mok (s) | reference (s) | reference / jax_mok | target |")
    print("|---|---|---|---|---|")
    ok = True
    for r in results:
        ok &= r["ratio"] >= TARGET and r["jax_mok"]["check"]["passed"]
        print(f"| {r['dtype']} | {r['jax_mok']['median_ms'] / 1e3:.2f} | "
              f"{r['B1']['median_ms'] / 1e3:.2f} | {r['ratio']:.2f}× | ≥ {TARGET:g}× "
              f"{'met' if r['ratio'] >= TARGET else 'MISSED'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
