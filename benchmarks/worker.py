"""One benchmark task in one process: every item of one shape (the first also measures the
ceilings).

``run.py`` starts a worker per task so that each shape begins with empty device memory (JAX's
allocator keeps what it grew; torch needs room next to it) and so that a crash or a hang in a
kernel costs one item, not the run. The worker appends JSON lines to ``spec["events"]``:
``{"event": "start", "key": ...}`` before an item and ``{"event": "record", ...}`` after it.
Exit code 3 asks for a fresh process after an unexpected error (the device may be unusable).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback

from benchmarks import runners
from benchmarks.impls import IMPLS, RUN_LAST, RUN_ORDER, runs_pass

RESTART_EXIT_CODE = 3


def item_key(shape: str, routing: str, passname: str, impl: str) -> str:
    return f"{shape}/{routing}/{passname}/{impl}"


def shape_items(shape: str, routings: list[str], passes: list[str],
                impls: list[str]) -> list[dict]:
    """The items of one shape in run order.

    Routing-major, then pass, then implementation (``impls.RUN_ORDER``: torch first in each
    group, while JAX's pool is still small), then the items of ``impls.RUN_LAST`` (B6, whose
    first call may search for minutes; B1, slow and often out of memory). So a short
    ``--budget-s`` still yields jax_mok next to its peers on the first (routing, pass) groups
    instead of one implementation's every item. An implementation without a pass (the
    forward-only ``-pq`` rows) has no item for it.
    """
    ordered = [i for i in RUN_ORDER if i in impls]
    first = [i for i in ordered if i not in RUN_LAST]

    def items(names):
        return [{"key": item_key(shape, r, p, i), "shape": shape, "routing": r, "pass": p,
                 "impl": i}
                for r in routings for p in passes for i in names if runs_pass(i, p)]

    return items(first) + [item for name in RUN_LAST if name in ordered for item in items([name])]


def routed_flops(shape, passname: str) -> int:
    """Forward = 6 T k H F (gate/up and down GEMMs); forward+backward = 3x that."""
    forward = shape.forward_flops()
    return forward if passname == "fwd" else 3 * forward


def _is_oom(error: BaseException) -> bool:
    from benchmarks import peers_torch

    text = str(error).lower()
    return ("resource_exhausted" in text or "out of memory" in text
            or peers_torch.is_oom(error))


def _device_may_be_broken(reason: str) -> bool:
    """After a CUDA/XLA runtime error the device context may be unusable: start afresh."""
    text = reason.lower()
    return any(word in text for word in ("cuda", "internal", "illegal", "xlaruntimeerror"))


class Events:
    def __init__(self, path: str):
        self.path = path

    def emit(self, event: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")


def _progress(t0: float, text: str) -> None:
    print(f"[{time.time() - t0:7.1f}s] {text}", flush=True)


def machine_info() -> dict:
    import jax
    import jaxlib

    from benchmarks import peers_liger, peers_torch

    dev = jax.devices()[0]
    info = {
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "host_cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "torch": peers_torch.torch_version(),
        "liger_kernel": peers_liger.liger_version(),
    }
    if dev.platform == "gpu":
        try:
            import torch

            if torch.cuda.is_available():
                info["gpu_name"] = torch.cuda.get_device_name(0)
                info["cuda_torch"] = torch.version.cuda
        except ImportError:
            pass
    return info


def run_ceilings(spec: dict, events: Events, t0: float) -> None:
    """Measures the matmul and copy ceilings; a failure is reported, not fatal."""
    import jax

    from benchmarks import ceilings

    _progress(t0, "measuring the bf16 and FP8 matmul and the copy ceilings")
    try:
        result = ceilings.measure(platform=jax.default_backend(), quick=spec["quick"],
                                  warmup=spec["warmup"], iters=spec["iters"])
    except Exception as error:  # noqa: BLE001 - the items still run without ceilings
        _progress(t0, f"ceilings failed: {type(error).__name__}: {error}")
        return
    finally:
        gc.collect()
    events.emit({"event": "ceilings", **result})
    fp8 = result["fp8_matmul_tflops"]
    _progress(t0, f"ceilings: bf16 matmul {result['matmul_tflops']:.1f} TFLOP/s, FP8 matmul "
                  + (f"{fp8:.1f} TFLOP/s" if fp8 else "not measured") +
                  f", copy {result['hbm_gbps']:.1f} GB/s")
    for name, error in result["details"].items():
        if name.endswith("_error"):
            _progress(t0, f"ceiling {name[:-6]} not measured: {error}")


class ShapeRunner:
    """Runs the items of one shape; problems, probes and reference outputs are made lazily."""

    def __init__(self, spec: dict, events: Events):
        import jax
        import jax.numpy as jnp

        from benchmarks import problems

        self.spec = spec
        self.events = events
        self.platform = jax.default_backend()
        self.dtype = jnp.dtype(spec["dtype"])
        self.shape = problems.scaled_shape(spec["shape"], spec["scale_tokens"],
                                           spec["scale_model"])
        self.machine: dict = {}  # machine_info(), once run() has started
        self.problems: dict = {}
        self.probes: dict = {}
        self.references: dict = {}
        self.t0 = spec.get("run_start", time.time())  # progress lines show the run's clock
        # items this process ran before the current one: an out-of-memory after others may be
        # the device heap they left (JAX's allocator keeps what it grew; torch's items share
        # the device), so the orchestrator retries such an item in a fresh worker
        self.items_run = 0

    def problem(self, routing: str):
        from benchmarks import problems

        if routing not in self.problems:
            weights = None
            for other in self.problems.values():
                if not other.weights_rotated:
                    weights = (other.sets[0].w_gate_up, other.sets[0].w_down)
            problem = problems.make_problem(self.shape, routing, dtype=self.dtype,
                                            num_sets=self.spec["num_sets"], weights=weights)
            self.problems[routing] = problem
            self.probes[routing] = problems.make_probe(
                problem, num_tokens=self.spec["probe_tokens"])
        return self.problems[routing]

    def reference(self, routing: str) -> dict:
        from benchmarks import problems

        if routing not in self.references:
            self.references[routing] = problems.reference_probe(
                self.problem(routing), self.probes[routing])
        return self.references[routing]

    def base_record(self, item: dict) -> dict:
        from benchmarks import peers_jax
        from jax_mok.config import weight_gradient_mode

        s = self.shape
        impl = IMPLS[item["impl"]]
        weight_bytes = peers_jax.bf16_bytes_per_expert(s, self.dtype)
        return {
            **{k: item[k] for k in ("key", "shape", "routing", "pass", "impl")},
            "tokens": s.tokens, "hidden": s.hidden, "ffn": s.ffn, "experts": s.experts,
            "top_k": s.top_k, "dtype": self.dtype.name, "flops": routed_flops(s, item["pass"]),
            "precision": impl.precision, "recipe": impl.recipe,
            "prequantized": impl.prequantized, "x_itemsize": self.dtype.itemsize,
            # the FP8 layer's weight-gradient mode (mok_internals: the layer's default)
            "fp8_weight_gradients": (weight_gradient_mode(None)
                                     if impl.precision == "fp8" and not impl.peer
                                     else None),
            # the weights as the implementation reads them (pre-quantized rows overwrite this)
            # and their gradients (dense, in the weights' dtype): the roofline's bytes
            "weight_bytes_per_expert": weight_bytes, "weight_grad_bytes_per_expert": weight_bytes,
            "iters": self.spec["iters"], "warmup": self.spec["warmup"],
            "num_sets": self.spec["num_sets"],
        }

    def run_item(self, item: dict) -> dict:
        record = self.base_record(item)
        record["process_items_before"] = self.items_run
        self.items_run += 1
        try:
            fresh = item["routing"] not in self.references
            start = time.time()
            problem = self.problem(item["routing"])
            record["routing_stats"] = problem.routing_stats()
            record["weights_rotated"] = problem.weights_rotated
            record["touched_weight_bytes"] = problem.touched_weight_bytes()
            record["experts_touched"] = record["routing_stats"]["experts_touched"]
            want = self.reference(item["routing"])
            if fresh:  # where a shape's fixed cost goes: inputs, probe and float32 reference
                _progress(self.t0, f"{item['shape']} {item['routing']}: inputs and reference "
                                   f"ready in {time.time() - start:.1f} s")
            runners.RUNNERS[IMPLS[item["impl"]].family](self, item, problem, want, record)
        except Exception as error:  # noqa: BLE001 - every failure becomes a record
            if _is_oom(error):
                record["status"] = "OOM"
                record["reason"] = str(error).splitlines()[0][:300] if str(error) else "OOM"
            else:
                record["status"] = "error"
                record["reason"] = f"{type(error).__name__}: {str(error)[:500]}"
                record["traceback"] = traceback.format_exc()[-3000:]
        finally:
            gc.collect()
        return record

    def check(self, got: dict, want: dict, record: dict, tolerances: dict | None = None) -> bool:
        """Compares the probed outputs with the reference; records the errors (the row's
        accuracy) and, when a bound is exceeded, status "check_failed"."""
        from benchmarks import problems

        record["check"] = problems.compare(got, {k: want[k] for k in got}, self.dtype, tolerances)
        if not record["check"]["passed"]:
            record["status"] = "check_failed"
            errs = ", ".join(f"{k} {v:.2e}" for k, v in record["check"]["errors"].items())
            record["reason"] = f"rel. error above {record['check']['tolerances']}: {errs}"
            return False
        return True

    def timed(self, step, record: dict) -> None:
        from benchmarks.timing import summarize, time_steps

        samples = time_steps(step, warmup=self.spec["warmup"], iters=self.spec["iters"])
        record.update(summarize(samples))
        record["tflops"] = record["flops"] / (record["median_ms"] * 1e-3) / 1e12
        record["status"] = "ok"

    def run(self) -> int:
        spec = self.spec
        skip = set(spec.get("skip", []))
        items = shape_items(spec["shape"], spec["routings"], spec["passes"], spec["impls"])
        info = self.machine = machine_info()
        self.events.emit({"event": "machine", **info})
        _progress(self.t0, f"{spec['shape']} worker on {info['device_kind']} ({info['platform']})")
        if spec.get("ceilings"):
            run_ceilings(spec, self.events, self.t0)
        for item in items:
            if item["key"] in skip:
                continue
            if time.time() > spec["deadline"]:
                record = self.base_record(item)
                record.update(status="skipped", reason="time budget (--budget-s) used up")
                self.events.emit({"event": "record", **record})
                continue
            self.events.emit({"event": "start", "key": item["key"], "time": time.time()})
            _progress(self.t0, f"{item['shape']} {item['routing']:8s} {item['pass']:6s} "
                               f"{item['impl']}: running")
            record = self.run_item(item)
            self.events.emit({"event": "record", **record})
            self._print(record)
            if record["status"] == "error" and _device_may_be_broken(record["reason"]):
                return RESTART_EXIT_CODE
        return 0

    def _print(self, r: dict) -> None:
        label = f"{r['shape']} {r['routing']:8s} {r['pass']:6s} {r['impl']:20s}"
        if r["status"] == "ok":
            text = (f"{label} {r['median_ms']:9.3f} ms  {r['tflops']:8.2f} TFLOP/s  "
                    f"(max rel. error {r['check']['max_error']:.1e})")
        else:
            text = f"{label} {r['status']}: {r.get('reason', '')[:160]}"
        _progress(self.t0, text)


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    return ShapeRunner(spec, Events(spec["events"])).run()
