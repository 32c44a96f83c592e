"""The harness's FP8 rows, B3-fp8, B6 and the roofline column (issues 13 and 16), on the CPU.

A quick ``python -m benchmarks.run`` over the new implementations, and unit tests of the parts
the CPU cannot time: the roofline formula, the implementation table, the report, the
pre-quantization against ``jax_mok.quantize_params``, B3-fp8's quantizers and math (torch, CPU
emulation of ``torch._scaled_grouped_mm``) and the layout B6 hands Liger-Kernel (a stand-in with
Liger's contract).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not os.path.isdir(os.path.join(REPO_ROOT, "benchmarks")),
                                reason="benchmarks/ is not part of this checkout")


def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    return torch


def test_quick_cpu_run_of_the_fp8_rows_and_new_peers(tmp_path):
    out = tmp_path / "bench"
    impls = "jax_mok,jax_mok-fp8_block,jax_mok-fp8_block-prep,jax_mok-mxfp8-pq,B3-fp8,B6"
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--shapes", "S6", "--routing",
           "balanced", "--passes", "fwd,fwdbwd", "--impls", impls, "--scale-tokens", "0.02",
           "--scale-model", "0.0625", "--iters", "2", "--budget-s", "150", "--out", str(out)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_MOK_BENCH_TORCH_CPU": "1"}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    result = json.loads((out / "results.json").read_text())
    records = {(r["impl"], r["pass"]): r for r in result["records"]}
    # the pre-quantized row is forward only: no fwdbwd item at all
    assert set(records) == {(i, p) for i in impls.split(",") for p in ("fwd", "fwdbwd")} - {
        ("jax_mok-mxfp8-pq", "fwdbwd")}

    ceilings = result["ceilings"]
    assert ceilings["matmul_tflops"] > 0 and ceilings["fp8_matmul_tflops"] > 0
    for key in (("jax_mok", "fwd"), ("jax_mok", "fwdbwd"), ("jax_mok-fp8_block", "fwd"),
                ("jax_mok-fp8_block", "fwdbwd"), ("jax_mok-fp8_block-prep", "fwd"),
                ("jax_mok-fp8_block-prep", "fwdbwd"), ("jax_mok-mxfp8-pq", "fwd")):
        r = records[key]
        assert r["status"] == "ok", f"{key}: {r['status']} {r.get('reason')}"
        assert r["check"]["passed"] and 0 < r["pct_roofline"] and r["roofline_ms"] > 0
        assert r["roofline_bound"] in ("compute", "memory")
        fp8 = r["precision"] == "fp8"
        assert r["ceiling_tflops"] == ceilings["fp8_matmul_tflops" if fp8 else "matmul_tflops"]
        # quantization really happened: FP8 rows are off by E4M3's error, bf16 ones far less
        assert (0.02 < r["check"]["errors"]["y"] < 0.1) if fp8 else r["check"]["max_error"] < 1e-2
    assert records[("jax_mok-fp8_block", "fwd")]["fp8_path"].startswith("pure-jax")
    pq = records[("jax_mok-mxfp8-pq", "fwd")]
    bf16_bytes = records[("jax_mok", "fwd")]["weight_bytes_per_expert"]
    # E4M3 values (1 byte) + one E8M0 scale per 32 elements: ~half the bf16 bytes
    assert pq["weight_bytes_per_expert"] == pytest.approx(bf16_bytes / 2 * (1 + 1 / 32), rel=0.05)
    # the prepared rows take bf16 master weights and fp8_weights' layouts made before timing;
    # their gradients are the master weights' (checked against the reference above)
    prep = records[("jax_mok-fp8_block-prep", "fwdbwd")]
    assert prep["prequantize_s"] > 0
    assert prep["weight_bytes_per_expert"] == pytest.approx(bf16_bytes / 2, rel=0.05)
    # its program holds the four FP8 layouts (~the bf16 weights' bytes) beside the master weights
    plain = records[("jax_mok", "fwdbwd")]["program_bytes"]["arguments"]
    experts = prep["experts"]
    assert prep["program_bytes"]["arguments"] - plain == pytest.approx(bf16_bytes * experts,
                                                                       rel=0.1)
    assert records[("B6", "fwd")]["status"] == "unavailable"
    assert "CUDA" in records[("B6", "fwd")]["reason"]
    b3 = records[("B3-fp8", "fwd")]
    try:
        import torch  # noqa: F401
    except ImportError:
        assert b3["status"] == "unavailable" and "torch" in b3["reason"]
    else:
        assert b3["status"] == "ok" and "emulation" in b3["b3_fp8_gemm"], b3.get("reason")
        assert records[("B3-fp8", "fwdbwd")]["status"] == "unsupported"

    table = (out / "results.md").read_text()
    assert ("| shape | routing | pass | impl | ms | TFLOP/s | % ceiling | % roofline | "
            "speed-up | accuracy |") in table
    assert "| S6 | balanced | fwd | jax_mok-fp8_block |" in table and "× bf16" in table
    assert "FP8 matmul" in table and (out / "results.png").is_file()


def _record(**overrides):
    r = {"status": "ok", "pass": "fwd", "tokens": 1000, "hidden": 512, "top_k": 4,
         "experts": 16, "x_itemsize": 2, "experts_touched": 10.0,
         "weight_bytes_per_expert": 3 * 512 * 256 * 2, "weight_grad_bytes_per_expert":
         3 * 512 * 256 * 2, "flops": 6 * 1000 * 4 * 512 * 256, "precision": "bf16"}
    r.update(overrides)
    return r


def test_roofline_formula():
    from benchmarks import roofline

    w = 3 * 512 * 256 * 2
    fwd = _record()
    assert roofline.moved_bytes(fwd) == 10 * w + 2 * 1000 * 512 * 2 + 8 * 1000 * 4
    bwd = _record(**{"pass": "fwdbwd", "flops": 3 * fwd["flops"]})
    assert roofline.moved_bytes(bwd) == 2 * 10 * w + 16 * w + 4 * 1000 * 512 * 2 + 12 * 4000
    ceilings = {"matmul_tflops": 1.0, "fp8_matmul_tflops": 2.0, "hbm_gbps": 1.0}
    line = roofline.roofline(fwd, ceilings)
    compute_ms, memory_ms = fwd["flops"] / 1e12 * 1e3, roofline.moved_bytes(fwd) / 1e9 * 1e3
    assert line["roofline_ms"] == pytest.approx(max(compute_ms, memory_ms))
    assert line["roofline_bound"] == ("compute" if compute_ms > memory_ms else "memory")
    fp8 = roofline.roofline(_record(precision="fp8"), ceilings)
    assert fp8["ceiling_tflops"] == 2.0
    assert roofline.roofline(fwd, {"matmul_tflops": 1.0}) is None  # no copy bandwidth measured


def test_the_copy_ceiling_is_the_best_measure_that_ran(monkeypatch):
    """The roofline's memory term comes from the fastest copy measure (the XLA pass, or torch's
    on a GPU); a torch failure is recorded and leaves the XLA measure."""
    from benchmarks import ceilings

    monkeypatch.setattr(ceilings, "_jax_copy", lambda *a: {"gbps": 3000.0})
    monkeypatch.setattr(ceilings, "_torch_copy", lambda *a: {"gbps": 4100.0})
    details = {}
    assert ceilings._copies(details, 1 << 20, 0, 1, gpu=True) == "torch_copy"
    assert ceilings._copies({}, 1 << 20, 0, 1, gpu=False) == "jax_copy"

    def broken(*args):
        raise RuntimeError("no torch here")

    monkeypatch.setattr(ceilings, "_torch_copy", broken)
    details = {}
    assert ceilings._copies(details, 1 << 20, 0, 1, gpu=True) == "jax_copy"
    assert "no torch here" in details["torch_copy_error"]
    monkeypatch.setattr(ceilings, "_jax_copy", lambda *a: {"gbps": 5000.0})
    monkeypatch.setattr(ceilings, "_torch_copy", lambda *a: {"gbps": 4100.0})
    assert ceilings._copies({}, 1 << 20, 0, 1, gpu=True) == "jax_copy"


def test_implementation_table_and_items():
    from benchmarks import impls, worker

    assert impls.expand(["jax_mok", "fp8"]) == ["jax_mok", "jax_mok-fp8_block", "jax_mok-mxfp8",
                                                "jax_mok-fp8_block-prep", "jax_mok-mxfp8-prep",
                                                "jax_mok-fp8_block-pq", "jax_mok-mxfp8-pq",
                                                "B3-fp8"]
    with pytest.raises(ValueError, match="unknown implementation 'B7'"):
        impls.expand(["B7"])
    items = worker.shape_items("S1", ["balanced"], ["fwd", "fwdbwd"], impls.expand(["all"]))
    keys = [i["key"] for i in items]
    assert "S1/balanced/fwdbwd/jax_mok-mxfp8-pq" not in keys
    assert "S1/balanced/fwd/jax_mok-mxfp8-pq" in keys
    assert [i["impl"] for i in items[-2:]] == ["B1", "B1"]  # B1 after everything else
    impls_in_order = [i["impl"] for i in items]
    # every jax_mok row, forward and forward+backward, before B6 (whose first call may search
    # for minutes), B6 before B1
    assert impls_in_order[-4:] == ["B6", "B6", "B1", "B1"]
    assert all(i["impl"] not in ("B6", "B1") for i in items[:-4])
    bounds = impls.tolerances("jax_mok-mxfp8")
    assert bounds["y"] == impls.FP8_TOLERANCE > impls.FP8_ACCURACY_TARGET
    assert impls.tolerances("jax_mok") is None
    assert impls.tolerances("B6") == {"d_topk_weights": impls.LIGER_DS_TOLERANCE}


def test_fp8_kernel_targets_are_read_from_custom_calls_only():
    from benchmarks.mok_internals import fp8_kernel_targets

    text = ('%0 = stablehlo.custom_call @mok_moe_fwd_fp8(%a) : ...\n'
            '"stablehlo.custom_call"(%b) {call_target_name = "mok_moe_bwd_saved_fp8"}\n'
            'custom_call_target="mok_moe_fwd_train_fp8"\n'
            'func.func private @jax_mok_fp8_helper()  // a name, not a call\n'
            'custom_call @mok_moe_fwd(%c)')
    assert fp8_kernel_targets(text) == ["mok_moe_bwd_saved_fp8", "mok_moe_fwd_fp8",
                                        "mok_moe_fwd_train_fp8"]
    assert fp8_kernel_targets("stablehlo.dot_general ... float8_e4m3fn") == []


def test_report_speedups_and_accuracy():
    from benchmarks import report

    def rec(impl, ms, precision="bf16", status="ok", y=3e-3):
        return {"key": f"S1/balanced/fwd/{impl}", "shape": "S1", "routing": "balanced",
                "pass": "fwd", "impl": impl, "status": status, "median_ms": ms,
                "tflops": 1.0 / ms, "precision": precision,
                "check": {"errors": {"y": y}, "max_error": y, "passed": True}}

    records = [rec("jax_mok", 2.0), rec("B3", 5.0), rec("B6", 4.0), rec("B2", 1.0, status="OOM"),
               rec("jax_mok-fp8_block", 1.0, "fp8", y=6e-2), rec("B3-fp8", 3.0, "fp8", y=6e-2)]
    result = {"meta": {"protocol": False}, "ceilings": {}, "records": records}
    result["speedups"] = report.speedups(records)
    pairs = {(s["impl"], s["peer"]): s["speedup"] for s in result["speedups"]}
    assert pairs == {("jax_mok", "B3"): 2.5, ("jax_mok", "B6"): 2.0,
                     ("jax_mok-fp8_block", "B3-fp8"): 3.0}  # same precision only
    table = report.markdown(result)
    assert "| S1 | balanced | fwd | jax_mok | 2.000 |" in table
    assert "2.00× B6" in table  # the best bf16 peer (B2 is OOM, B3 slower)
    assert "3.00× B3-fp8; 2.00× bf16" in table
    assert "y 6.0e-02 †" in table and "| OOM |" in table


def test_prequantize_equals_quantize_params(monkeypatch):
    import jax
    import jax.numpy as jnp

    import jax_mok
    from benchmarks import peers_jax

    config = jax_mok.MoEConfig(num_experts=6, top_k=2, hidden_size=160, ffn_size=72)
    params = jax_mok.init_params(jax.random.key(0), config)
    # 2 experts per chunk: the chunked path must give quantize_params' bits
    monkeypatch.setattr(peers_jax, "PREQUANTIZE_CHUNK_BYTES", 2 * 160 * 144 * 4)
    assert peers_jax._experts_per_chunk(params.w_gate_up) == 2
    for recipe in ("mxfp8", "fp8_block"):
        want = jax_mok.quantize_params(params, recipe)
        got = peers_jax.prequantize(params.w_gate_up, params.w_down, recipe)
        for g, w in zip(got, (want.w_gate_up, want.w_down), strict=True):
            assert (g.recipe, g.reduction_axis, g.shape) == (w.recipe, w.reduction_axis, w.shape)
            for a, b in ((g.values, w.values), (g.scales, w.scales)):
                np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)),
                                              np.asarray(b.astype(jnp.float32)))


def test_b3_fp8_quantizers_and_math():
    torch = _torch()
    from benchmarks import peers_torch_fp8 as b3

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 64, generator=gen).to(torch.bfloat16)
    x[3] = 0  # an all-zero row keeps scale 1 and quantizes to zeros
    values, scale = b3.quantize_rows(x)
    assert values.dtype == torch.float8_e4m3fn and scale.shape == (37,) and scale[3] == 1
    assert values.float().abs().amax(dim=1)[[0, 1, 2]].tolist() == [448.0] * 3
    deq = values.float() * scale[:, None]
    assert ((deq - x.float()).norm() / x.float().norm()) < 0.04  # E4M3: ~2.7 % RMS

    w = torch.randn(3, 64, 48, generator=gen).to(torch.bfloat16)
    wv, ws = b3.quantize_columns(w)
    assert wv.shape == (3, 64, 48) and ws.shape == (3, 48)
    assert wv.stride() == (48 * 64, 1, 64)  # column-major [E, K, N], as the FP8 GEMM reads B
    assert ((wv.float() * ws[:, None, :] - w.float()).norm() / w.float().norm()) < 0.04
    w32 = w.float()
    before = w32.clone()
    b3.quantize_columns(w32)  # works on a copy: float32 weights are left as they were
    assert torch.equal(w32, before)

    # the layer against the same math on the dequantized operands, in float64
    T, k, E, H, F = 40, 2, 3, 64, 32
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    tw = torch.softmax(torch.randn(T, k, generator=gen), -1)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
    gu = (torch.randn(E, H, 2 * F, generator=gen) / H**0.5).to(torch.bfloat16)
    dn = (torch.randn(E, F, H, generator=gen) / F**0.5).to(torch.bfloat16)
    y = b3.routed_experts(x, ids, tw, gu, dn)
    xq, xs = b3.quantize_rows(x)
    guq, gus = b3.quantize_columns(gu)
    dnq, dns = b3.quantize_columns(dn)
    want = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            h = (xq[t].double() * xs[t]) @ (guq[e].double() * gus[e][None, :].double())
            h = h.to(torch.bfloat16).double()  # the GEMM's bf16 output
            a = torch.nn.functional.silu(h[:F]) * h[F:]
            aq, as_ = b3.quantize_rows(a.float()[None])
            out = (aq[0].double() * as_[0]) @ (dnq[e].double() * dns[e][None, :].double())
            want[t] += tw[t, j].double() * out.to(torch.bfloat16).double()
    # bf16 output rounding of y and float32 vs float64 sums only
    assert ((y.double() - want).norm() / want.norm()) < 5e-3


def test_b6_hands_liger_its_layout():
    """LigerRunner with a stand-in that implements Liger's contract (gate_up_proj [E, 2F, H]
    with gate first, down_proj [E, H, F], int32 ids) in plain torch gives B3's outputs and
    gradients, in jax_mok's layout."""
    torch = _torch()
    import jax

    from benchmarks import peers_liger, peers_torch, problems
    from jax_mok import testing

    shape = testing.Shape("T", "test", 48, 64, 32, 4, 2)
    problem = problems.make_problem(shape, "balanced", num_sets=1, dtype=jax.numpy.float32)

    def liger_contract(x, ids, tw, gate_up_proj, down_proj):
        assert ids.dtype == torch.int32 and gate_up_proj.is_contiguous()
        F = down_proj.shape[2]
        y = torch.zeros_like(x)
        for j in range(ids.shape[1]):
            w_gu, w_dn = gate_up_proj[ids[:, j].long()], down_proj[ids[:, j].long()]
            h = torch.einsum("th,tnh->tn", x, w_gu)
            a = torch.nn.functional.silu(h[:, :F]) * h[:, F:]
            y = y + tw[:, j:j + 1] * torch.einsum("tf,thf->th", a, w_dn)
        return y

    for passname in ("fwd", "fwdbwd"):
        b3 = peers_torch.TorchRunner(problem, passname)
        b6 = peers_liger.LigerRunner(problem, passname, fn=liger_contract)
        want, got = b3.run(0), b6.run(0)
        if passname == "fwd":
            want, got = (want,), (got,)
        else:
            want, got = (want[0], *want[1]), (got[0], *got[1])
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_the_fp8_rows_run_the_layers_default_weight_gradient_mode(monkeypatch):
    """The harness's FP8 rows (mok_internals.routed_experts_fp8 without weight_grads) run what
    jax_mok.moe runs for MoEConfig(fp8_weight_gradients=None) on one device, and say so."""
    from benchmarks import mok_internals, worker
    from jax_mok.config import MoEConfig, weight_gradient_mode

    seen = {}

    class FakeFp8:
        @staticmethod
        def routed_experts_fp8(*args, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(mok_internals, "_fp8_module", lambda: FakeFp8)
    mok_internals.routed_experts_fp8("fp8_block", "ffi")(None, None, None, None, None)
    default = MoEConfig(num_experts=8, top_k=2, hidden_size=128, ffn_size=128,
                        quantization="fp8_block").weight_gradient_mode()
    assert seen["weight_grads"] == default == weight_gradient_mode(None) == "unquantized"
    mok_internals.routed_experts_fp8("fp8_block", "ffi", "fp8")(None, None, None, None, None)
    assert seen["weight_grads"] == "fp8"
    assert weight_gradient_mode(None, expert_parallel=True) == "fp8"

    spec = {"dtype": "bfloat16", "shape": "S6", "scale_tokens": 0.01, "scale_model": 0.0625,
            "iters": 2, "warmup": 1, "num_sets": 1}
    runner = worker.ShapeRunner(spec, events=None)
    for impl, mode in (("jax_mok-fp8_block", default), ("jax_mok-mxfp8", default),
                       ("B3-fp8", None), ("jax_mok", None)):
        item = {"key": f"S6/balanced/fwdbwd/{impl}", "shape": "S6", "routing": "balanced",
                "pass": "fwdbwd", "impl": impl}
        assert runner.base_record(item)["fp8_weight_gradients"] == mode, impl


def test_fp8_items_wait_for_the_program_before_probing(monkeypatch):
    """S4's FP8 fwd+bwd OOM read ``executable_name='jit_convert_element_type'``: the timed
    program's own allocation (its 24 GiB temp buffer) failed, and as execution is asynchronous
    the error surfaced in the first eager op that read its outputs, the probe's astype. run_jax
    waits for the program before probing, so such a failure is reported as the program's."""
    import dataclasses

    import jax

    from benchmarks import mok_internals, problems, runners, worker
    from jax_mok import testing

    if not mok_internals.kernels_built("cpu"):
        pytest.skip("jax_mok's CPU kernels are not built")
    spec = {"dtype": "bfloat16", "shape": "S4", "scale_tokens": 1.0, "scale_model": 1.0,
            "iters": 2, "warmup": 1, "num_sets": 2, "probe_tokens": 16}
    sr = worker.ShapeRunner(spec, events=None)
    sr.shape = dataclasses.replace(testing.SHAPES["S4"], tokens=96, hidden=256, ffn=128,
                                   experts=16, top_k=2)
    problem, want = sr.problem("balanced"), sr.reference("balanced")

    events = []
    block, probe_outputs = jax.block_until_ready, problems.probe_outputs

    def spy_block(x):
        events.append(("block", {id(leaf) for leaf in jax.tree.leaves(x)}))
        return block(x)

    def spy_probe(probe, y, grads=None):
        events.append(("probe", id(y)))
        return probe_outputs(probe, y, grads)

    monkeypatch.setattr(jax, "block_until_ready", spy_block)
    monkeypatch.setattr(problems, "probe_outputs", spy_probe)
    for impl, passname in (("jax_mok-fp8_block", "fwdbwd"), ("jax_mok-fp8_block-pq", "fwd")):
        events.clear()
        item = {"key": f"S4/balanced/{passname}/{impl}", "shape": "S4", "routing": "balanced",
                "pass": passname, "impl": impl}
        record = sr.base_record(item)
        runners.run_jax(sr, item, problem, want, record)
        assert record["status"] == "ok", (impl, record.get("reason"))
        first_probe = next(i for i, e in enumerate(events) if e[0] == "probe")
        blocked = [e[1] for e in events[:first_probe] if e[0] == "block"]
        assert blocked and events[first_probe][1] in blocked[-1], (impl, events)
