"""The end-to-end training benchmark runs (tiny dims on the CPU) and writes its outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("matplotlib")


def _run(tmp_path, *extra):
    from benchmarks.e2e import run

    return run.main(["--tiny", "--layers", "1", "--seq", "16", "--batch", "2", "--steps", "1",
                     "--warmup", "1", "--out", str(tmp_path), *extra])


def _check(result, tmp_path):
    for name, record in result["variants"].items():
        assert record["status"] == "ok", (name, record)
        assert record["tokens_per_s"] > 0 and 0 < record["mfu"] < 1, (name, record)
        assert all(loss == loss for loss in record["losses"]), name  # no NaN
    saved = json.loads((tmp_path / "e2e.json").read_text())
    assert saved["flops_per_token"] == result["flops_per_token"]
    assert (tmp_path / "e2e.png").stat().st_size > 0


def test_e2e_tiny_jax_mok(tmp_path):
    """The CI smoke run: one variant, one layer (one compiled step; < 30 s on 2 cores)."""
    result = _run(tmp_path, "--variants", "jax_mok")
    _check(result, tmp_path)
    assert "| jax_mok | 2 |" in (tmp_path / "e2e.md").read_text()


@pytest.mark.slow
def test_e2e_tiny_all_variants(tmp_path):
    result = _run(tmp_path)
    assert list(result["variants"]) == ["jax_mok", "padded", "reference"]
    _check(result, tmp_path)
    # One seed, one model: the first loss agrees across variants (bf16 layers: 1e-2).
    first = [r["losses"][0] for r in result["variants"].values()]
    assert max(first) - min(first) < 1e-2 * abs(first[0])
    assert result["variants"]["padded"]["capacity"] >= 8
    assert result["variants"]["padded"]["dropped_fraction"] == 0.0
    assert "speed-up" in (tmp_path / "e2e.md").read_text()


@pytest.mark.slow
def test_e2e_tiny_expert_parallel(tmp_path):
    """--expert-parallel over 2 forced CPU devices (a subprocess: the device count is fixed at
    backend creation)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.e2e.run", "--tiny", "--layers", "1", "--seq", "16",
         "--batch", "1", "--steps", "1", "--warmup", "1", "--expert-parallel",
         "--variants", "jax_mok,padded", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads((tmp_path / "e2e.json").read_text())
    assert result["expert_parallel"] and result["machine"]["devices"] == 2
    assert list(result["variants"]) == ["jax_mok"]  # padded: single-device only, skipped
    assert result["variants"]["jax_mok"]["status"] == "ok"


def test_e2e_out_of_memory_retry_and_cudnn_fallback(tmp_path, monkeypatch):
    """The driver's recovery paths without compiling anything: an out-of-memory error halves
    the batch once (--oom-retries 1) and is then reported; a cuDNN attention error switches to
    XLA attention."""
    from benchmarks.e2e import run

    calls = []

    def fake_run_variant(variant, cfg, args, batch, mesh, attention, ceiling, n_devices):
        calls.append((variant, batch, attention))
        if variant == "reference":
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
        if attention == "cudnn":
            raise RuntimeError("INTERNAL: cuDNN attention is not supported for this shape")
        return {"variant": variant, "status": "ok", "batch": batch, "step_ms_median": 1.0,
                "tokens_per_s": 1e3, "mfu": 0.1}

    monkeypatch.setattr(run, "run_variant", fake_run_variant)
    result = run.main(["--tiny", "--layers", "1", "--batch", "8", "--attention", "auto",
                       "--variants", "jax_mok,reference", "--out", str(tmp_path)])
    assert calls[:2] == [("jax_mok", 8, None), ("reference", 8, None)]  # CPU: XLA attention
    assert calls[2] == ("reference", 4, None) and len(calls) == 3
    assert result["variants"]["reference"]["status"] == "oom"
    assert result["variants"]["reference"]["oom_batches"] == [8]
    assert "| reference | 4 | - | - | - | - | oom: RESOURCE_EXHAUSTED" in (
        tmp_path / "e2e.md").read_text()

    calls.clear()
    monkeypatch.setattr(run, "_auto_attention", lambda platform: "cudnn")
    result = run.main(["--tiny", "--layers", "1", "--variants", "jax_mok", "--out",
                       str(tmp_path)])
    assert calls == [("jax_mok", 8, "cudnn"), ("jax_mok", 8, "xla")]
    assert result["attention"] == "xla (cuDNN failed)"
    assert result["variants"]["jax_mok"]["status"] == "ok"
