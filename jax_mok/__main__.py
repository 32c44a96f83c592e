"""``python -m jax_mok``: ``info``, ``bench``, ``check`` and ``--version`` (``--help`` for each).

- ``info``: what is built (CPU / CUDA kernels), the JAX version and devices, which expert-parallel
  transport ``"auto"`` picks over every device (with the reason), and every setting (tuning
  fields, ``JAX_MOK_*`` variables) with its value and where the value comes from.
- ``bench``: a jitted forward + backward of a preset on the default device, checked against the
  reference, then timed (median), printed as ms and TFLOP/s.
- ``check``: only the reference check of ``bench``.

Progress lines start at once (the first compilation can take minutes); on a terminal the timing
loop redraws one line, elsewhere (a pipe, a log file) each step prints a plain line.
"""

from __future__ import annotations

import argparse
import collections
import signal
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

DESCRIPTION = """\
jax_mok: a fused Mixture-of-Experts layer for JAX.

'python -m jax_mok COMMAND --help' lists a command's options with their defaults."""


class Reporter:
    """Prints progress as it happens: each phase at once, with the seconds since the start;
    on a terminal the timing loop redraws one line, elsewhere it prints one line per run."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.start = time.perf_counter()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def phase(self, text: str) -> None:
        self.line(f"  [{time.perf_counter() - self.start:6.1f} s] {text}")

    def progress(self, label: str, done: int, total: int, detail: str = "") -> None:
        if not self.tty:
            self.line(f"  {label} {done}/{total}{': ' + detail if detail else ''}")
            return
        width = 30
        filled = int(width * done / max(total, 1))
        end = "\n" if done == total else ""
        self.stream.write(f"\r  {label} [{'#' * filled}{'.' * (width - filled)}] "
                          f"{done}/{total} {detail}{end}")
        self.stream.flush()


# ------------------------------------------------------------------ info

def _devices_summary() -> str:
    counts = collections.Counter(d.device_kind for d in jax.devices())
    return ", ".join(f"{n} x {kind}" for kind, n in counts.items())


def _cuda_section() -> list[str]:
    cuda = _ffi.cuda_module()
    if cuda is None:
        return ["CUDA kernels    : not built (install with nvcc on PATH, or JAX_MOK_CUDA=1 to make "
                "a missing nvcc an error)"]
    lines = ["CUDA kernels    : built"]
    info = cuda.device_info() if hasattr(cuda, "device_info") else {}
    if "compiled_arch" in info:
        lines.append(f"  compiled for  : {info['compiled_arch']}")
    if "wgmma_path" in info:
        path = ("wgmma tensor-core GEMMs for bfloat16, SIMT for float32" if info["wgmma_path"]
                else "SIMT GEMMs only (built without CUTLASS: bfloat16 runs slowly)")
        lines.append(f"  GEMM path     : {path}")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if gpus:
        lines.append(f"  GPUs          : {len(gpus)} x {gpus[0].device_kind} "
                     f"(compute capability {_ffi.gpu_capability()})")
        reason = _ffi.cuda_device_limits()
        lines.append("  on this GPU   : " + (
            "supported" if reason is None else
            f"unsupported ({reason}): the default implementation is the reference"))
    else:
        lines.append("  GPUs          : none visible to JAX (the kernels need an sm_90 GPU)")
    return lines


def _ep_transport() -> str:
    """What ``transport="auto"`` picks on a 1-D expert mesh of every device, and why."""
    devices = jax.devices()
    if len(devices) < 2:
        return "one device, no exchange"
    mesh = jax.sharding.Mesh(np.array(devices), ("expert",))
    ok, reason = workspace.peer_transport_available(mesh, "expert")
    default = plan.default_transport()
    if ok:
        return (f"transport 'peer' available ({reason}; FP8 layers: 'xla' unless "
                f"transport='peer' is passed); JAX_MOK_TRANSPORT={default}")
    return f"transport 'xla' ({reason}); JAX_MOK_TRANSPORT={default}"


def _settings_table() -> list[str]:
    rows = [(name, value, source,
             tuning.REGISTRY[name].role if name in tuning.REGISTRY else "tuning field")
            for name, value, source in tuning.settings()]
    header = ("setting", "value", "source", "kind")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(4)]
    out = ["  " + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    for row in rows:
        out.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    return out


def cmd_info(_args) -> int:
    jaxlib_version = getattr(jax.lib, "__version__", "?") if hasattr(jax, "lib") else "?"
    print(f"jax_mok {jax_mok.__version__}  (jax {jax.__version__}, jaxlib {jaxlib_version})")
    print(f"default backend : {jax.default_backend()}; devices: {_devices_summary()}")
    cpu = _ffi.cpu_module()
    if cpu is None:
        print("CPU kernels     : not built")
    else:
        print(f"CPU kernels     : built ({cpu.num_threads()} threads; JAX_MOK_CPU_THREADS)")
    for line in _cuda_section():
        print(line)
    print(f"default implementation: {api.default_implementation()}")
    print(f"expert parallelism over all {len(jax.devices())} devices: {_ep_transport()}")
    print("settings (source: default / env / argument; tuning fields: jax_mok.Tuning, "
          "variables: jax_mok/tuning.py's registry):")
    for line in _settings_table():
        print(line)
    unknown = tuning.unknown_variables()
    if unknown:
        print(f"ignored (not jax_mok settings: misspelled or removed): {', '.join(unknown)}")
    return 0


# ------------------------------------------------------------------ bench / check

def _problem(args):
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


def _check(config, params, x, cot, impl, report: Reporter) -> bool:
    """The kernel's forward value and gradients against a float32 oracle on the same routing."""
    tol = testing.tolerance(x.dtype)
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
    report.phase(f"check: compiling and running implementation={impl!r}")
    got = experts(impl)(x2d, w, gu, dn)
    report.phase("check: compiling and running the float32 oracle")
    want = experts("oracle")(*testing.upcast((x2d, w, gu, dn)))
    report.line(f"  check vs float32 oracle (relative Frobenius error, tolerance {tol:.0e})")
    ok = True
    names = ["loss", "dx", "d_topk_weights", "d_w_gate_up", "d_w_down"]
    for name, a, b in zip(names, jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        err = testing.rel_error(a, b)
        good = err <= tol and np.isfinite(err)
        ok &= good
        report.line(f"    {name:16s} {err:9.2e}  {'ok' if good else 'FAIL'}")
    return ok


def cmd_bench(args, time_it: bool = True, report: Reporter | None = None) -> int:
    report = report or Reporter()
    impl = args.implementation or api.default_implementation()
    config = testing.PRESETS[args.preset]
    flops = 3 * config.routed_flops(args.tokens)  # forward + backward = 3 x forward
    report.line(f"jax_mok {args.command}: preset={args.preset} tokens={args.tokens} "
                f"dtype={args.dtype} implementation={impl} device={jax.devices()[0].platform}")
    report.line(f"  E={config.num_experts} k={config.top_k} H={config.hidden_size} "
                f"F={config.ffn_size}; routed forward+backward = {flops / 1e9:.1f} GFLOP")
    report.phase("building the inputs")
    config, params, x, cot = _problem(args)
    ok = _check(config, params, x, cot, impl, report)
    if not time_it:
        report.line("  reference check: " + ("PASSED" if ok else "FAILED"))
        return 0 if ok else 1
    step = _step(impl)
    report.phase("compiling the timed step (jax_mok.moe forward + backward)")
    t0 = time.perf_counter()
    jax.block_until_ready(step(x, params, cot))
    report.phase(f"compiled, first run took {time.perf_counter() - t0:.2f} s; timing")
    times = []
    for i in range(args.iters):
        t0 = time.perf_counter()
        jax.block_until_ready(step(x, params, cot))
        times.append(time.perf_counter() - t0)
        report.progress("timing", i + 1, args.iters, f"{times[-1] * 1e3:.2f} ms")
    med = statistics.median(times)
    report.line(f"  forward+backward: median {med * 1e3:.2f} ms over {args.iters} runs "
                f"(min {min(times) * 1e3:.2f}), {flops / med / 1e12:.3f} TFLOP/s routed")
    report.line("  reference check: " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


# ------------------------------------------------------------------ the parser

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m jax_mok", description=DESCRIPTION,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version",
                     version=f"jax_mok {jax_mok.__version__} (jax {jax.__version__})")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("info", help="what is built, the devices, the transport, every setting",
                   description="Print what is built (CPU / CUDA kernels), the JAX version and "
                               "devices, the expert-parallel transport 'auto' picks, and every "
                               "setting with its value and source.")
    for name, text in (("bench", "time a preset's jitted forward + backward"),
                       ("check", "check a preset's kernels against the float32 oracle")):
        p = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        p.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(testing.PRESETS),
                       help="the layer's sizes (jax_mok.testing.PRESETS)")
        p.add_argument("--tokens", type=_positive_int, default=1024, help="tokens per call")
        p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                       help="dtype of x and the expert weights")
        p.add_argument("--iters", type=_positive_int, default=5,
                       help="timed runs (bench; the median is reported)")
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
        p.add_argument("--implementation", default=None, choices=list(autodiff.IMPLEMENTATIONS),
                       help="None: the kernels where built for the default backend, else the "
                            "reference")
    return top


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.command == "info":
        return cmd_info(args)
    return cmd_bench(args, time_it=args.command == "bench")


if __name__ == "__main__":
    if hasattr(signal, "SIGPIPE"):  # `python -m jax_mok info | head`: stop quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
