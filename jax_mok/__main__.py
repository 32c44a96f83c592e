"""``python -m jax_mok info | bench | check``.

  info   what is built (CPU / CUDA kernels), the JAX version and devices, which expert-
         parallel transport ("peer" or "xla") `auto` picks over every device, with the reason,
         and every setting (tuning fields, JAX_MOK_* variables) with its value and source
  bench  a jitted forward+backward of a preset on the default device: checked against the
         reference, then timed (median), printed as ms and TFLOP/s
  check  only the reference check of ``bench``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mok
from jax_mok import api, reference, testing, tuning
from jax_mok.ep import plan, workspace
from jax_mok.kernels import _ffi, autodiff
from jax_mok.routing import route


def _progress(label: str, done: int, total: int, width: int = 30) -> None:
    filled = int(width * done / max(total, 1))
    end = "\n" if done == total else ""
    sys.stdout.write(f"\r  {label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}{end}")
    sys.stdout.flush()


def cmd_info(_args) -> int:
    b = _ffi.backends()
    print(f"jax_mok {jax_mok.__version__}  (jax {jax.__version__}, jaxlib "
          f"{jax.lib.__version__ if hasattr(jax.lib, '__version__') else '?'})")
    print(f"  default backend : {jax.default_backend()}  devices: {jax.devices()}")
    cpu = _ffi.cpu_module()
    threads = cpu.num_threads() if cpu else 0
    print(f"  CPU kernels     : {'built' if b['cpu_kernels'] else 'missing'}"
          f" (mok_moe_fwd / mok_moe_bwd, {threads} threads)")
    cuda = _ffi.cuda_module()
    detail = ""
    if cuda is not None and hasattr(cuda, "device_info"):
        detail = f" {cuda.device_info()}"
    print(f"  CUDA kernels    : {'built' if cuda else 'not built'}{detail}")
    print(f"  default implementation here: {api.default_implementation()}")
    print(f"  expert parallelism over all {len(jax.devices())} devices: {_ep_transport()}")
    print("  settings (value, source; the registry and tuning fields: jax_mok/tuning.py):")
    rows = tuning.settings()
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        role = tuning.REGISTRY[name].role if name in tuning.REGISTRY else "tuning"
        print(f"    {name:{width}s}  {value}  [{source}; {role}]")
    unknown = tuning.unknown_variables()
    if unknown:
        print(f"  ignored (not jax_mok settings: misspelled or removed): {', '.join(unknown)}")
    return 0


def _ep_transport() -> str:
    """What ``transport="auto"`` picks on a 1-D expert mesh of every device, and why."""
    devices = jax.devices()
    if len(devices) < 2:
        return "one device, no exchange"
    mesh = jax.sharding.Mesh(np.array(devices), ("expert",))
    ok, reason = workspace.peer_transport_available(mesh, "expert")
    default = plan.default_transport()
    if ok:
        return f"transport 'peer' available ({reason}); JAX_MOK_TRANSPORT={default}"
    return f"transport 'xla' ({reason}); JAX_MOK_TRANSPORT={default}"


def _problem(args):
    if args.preset not in testing.PRESETS:
        raise SystemExit(f"--preset must be one of {sorted(testing.PRESETS)}, got {args.preset!r}")
    config = testing.PRESETS[args.preset]
    dtype = jnp.dtype(args.dtype)
    key = jax.random.key(args.seed)
    params = testing.random_params(jax.random.fold_in(key, 0), config, dtype)
    x = jax.random.normal(jax.random.fold_in(key, 1), (args.tokens, config.hidden_size),
                          jnp.float32).astype(dtype)
    cot = jax.random.normal(jax.random.fold_in(key, 2), x.shape, jnp.float32)
    return config, params, x, cot


def _step(impl):
    def loss(x, params, cot):
        y = jax_mok.moe(x, params, implementation=impl)
        return jnp.sum(y.astype(jnp.float32) * cot)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def _check(config, params, x, cot, impl) -> bool:
    """The kernel's forward value and gradients against a float32 oracle on the same routing."""
    tol = testing.tolerance(x.dtype)
    print(f"  check vs float32 reference (rel. Frobenius error, tolerance {tol:.0e})")
    x2d = x.reshape(-1, config.hidden_size)
    routing, _ = route(x2d, params.router, params.router_bias, config)
    ids = np.asarray(routing.topk_ids)
    capacity = int(np.bincount(ids[ids >= 0].ravel(), minlength=config.num_experts).max())

    def experts(impl_name):
        def f(x2d, w, gu, dn, ids, cot):
            if impl_name == "oracle":
                # padded batched einsum: exact, and fast on XLA:CPU where ragged_dot is not
                y = reference.routed_experts_padded(x2d, ids, w, gu, dn, capacity)
            else:
                y = autodiff.routed_experts(x2d, ids, w, gu, dn, implementation=impl_name)
            return jnp.sum(y.astype(jnp.float32) * cot)
        grad = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))
        return lambda *operands: grad(*operands, routing.topk_ids, cot)

    w = routing.topk_weights
    gu, dn = params.w_gate_up.astype(x.dtype), params.w_down.astype(x.dtype)
    got = experts(impl)(x2d, w, gu, dn)
    want = experts("oracle")(*testing.upcast((x2d, w, gu, dn)))
    ok = True
    names = ["loss", "dx", "d_topk_weights", "d_w_gate_up", "d_w_down"]
    for name, a, b in zip(names, jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        err = testing.rel_error(a, b)
        good = err <= tol and np.isfinite(err)
        ok &= good
        print(f"    {name:16s} {err:9.2e}  {'ok' if good else 'FAIL'}")
    return ok


def cmd_bench(args, time_it: bool = True) -> int:
    config, params, x, cot = _problem(args)
    impl = args.implementation or api.default_implementation()
    flops = 3 * config.routed_flops(args.tokens)  # forward + backward = 3 x forward
    print(f"jax_mok bench: preset={args.preset} tokens={args.tokens} dtype={args.dtype} "
          f"implementation={impl} device={jax.devices()[0].platform}")
    print(f"  E={config.num_experts} k={config.top_k} H={config.hidden_size} "
          f"F={config.ffn_size}; routed forward+backward = {flops / 1e9:.1f} GFLOP")
    ok = _check(config, params, x, cot, impl)
    if not time_it:
        return 0 if ok else 1
    step = _step(impl)
    t0 = time.perf_counter()
    jax.block_until_ready(step(x, params, cot))
    print(f"  compile + first run: {time.perf_counter() - t0:.2f} s")
    times = []
    for i in range(args.iters):
        t0 = time.perf_counter()
        jax.block_until_ready(step(x, params, cot))
        times.append(time.perf_counter() - t0)
        _progress("timing", i + 1, args.iters)
    med = statistics.median(times)
    print(f"  forward+backward: median {med * 1e3:.2f} ms over {args.iters} runs "
          f"(min {min(times) * 1e3:.2f}), {flops / med / 1e12:.3f} TFLOP/s routed")
    print("  reference check: " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_mok", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="what is built and which devices JAX sees")
    for name in ("bench", "check"):
        p = sub.add_parser(name, help=f"{name} a preset's forward+backward")
        p.add_argument("--preset", default="qwen3-30b-a3b",
                       help=f"one of {sorted(testing.PRESETS)}")
        p.add_argument("--tokens", type=int, default=1024)
        p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
        p.add_argument("--iters", type=int, default=5)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--implementation", default=None, choices=list(autodiff.IMPLEMENTATIONS))
    args = parser.parse_args(argv)
    if args.command == "info":
        return cmd_info(args)
    if args.tokens < 1 or args.iters < 1:
        parser.error("--tokens and --iters must be >= 1")
    return cmd_bench(args, time_it=args.command == "bench")


if __name__ == "__main__":
    sys.exit(main())
