"""The end-to-end benchmark's batch policies (--batch-policy shared, --own-best) and its step-time
breakdown (--breakdown), on the CPU: the policies with a stand-in for run_variant (nothing
compiled), then tiny real runs whose step raises the out-of-memory error XLA raises."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("matplotlib")

import jax  # noqa: E402

OOM = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 12.00GiB."
RAGGED = "UNIMPLEMENTED: ragged_dot is not supported for this configuration"


def _oom() -> Exception:
    """What XLA raises when a step runs out of device memory (the type the driver sees)."""
    return jax.errors.JaxRuntimeError(OOM)


def _fake(calls, fits, profiled=None):
    """A run_variant stand-in: ``fits[variant]`` is the largest batch that runs (None: a non-OOM
    error at any batch); tokens/s grows with the batch, sub-linearly. ``profiled``: gets each
    call's --breakdown."""
    profiled = [] if profiled is None else profiled

    def run_variant(variant, cfg, args, batch, mesh, attention, ceiling, n_devices):
        calls.append((variant, batch))
        profiled.append(args.breakdown)
        limit = fits[variant]
        if limit is None:
            raise jax.errors.JaxRuntimeError(RAGGED)
        if batch > limit:
            raise _oom()
        tps = 1e3 * batch ** 0.5
        return {"variant": variant, "text": variant, "status": "ok", "batch": batch,
                "step_ms_median": 1e3 * batch / tps, "tokens_per_s": tps, "mfu": tps * 1e-5,
                "losses": [5.0, 4.0], "final_loss": 4.0,
                "quantization": "fp8_block" if "fp8" in variant else None}

    return run_variant


def _main(tmp_path, *extra):
    from benchmarks.e2e import run

    return run.main(["--tiny", "--layers", "1", "--out", str(tmp_path), *extra])


def test_shared_batch_search_rows_and_own_best(tmp_path, monkeypatch):
    """padded runs out of memory at 16 and 8 and runs at 4: every variant then runs at 4 once;
    reference (ragged_dot) fails there and keeps its row with the error; jax_mok and its FP8
    variant also run at doubling batches until out of memory, as separate rows."""
    from benchmarks.e2e import run

    calls = []
    fits = {"padded": 4, "jax_mok": 16, "jax_mok_fp8_block": 8, "reference": None}
    profiled = []
    monkeypatch.setattr(run, "run_variant", _fake(calls, fits, profiled))
    result = _main(tmp_path, "--batch", "16", "--batch-policy", "shared", "--own-best",
                   "--breakdown", "--variants", "jax_mok,jax_mok_fp8_block,padded,reference")
    assert calls == [("padded", 16), ("padded", 8), ("padded", 4),  # the search, anchor first
                     ("jax_mok", 4), ("jax_mok_fp8_block", 4), ("reference", 4),
                     ("jax_mok", 8), ("jax_mok", 16), ("jax_mok", 32),  # own best: doubling
                     ("jax_mok_fp8_block", 8), ("jax_mok_fp8_block", 16)]
    assert profiled == [True] * 6 + [False] * 5  # the own-best search is not profiled
    search = result["batch_search"]
    assert search["shared_batch"] == result["batch"] == 4 and search["anchor"] == "padded"
    assert [(a["batch"], a["status"]) for a in search["attempts"]] == [
        (16, "oom"), (8, "oom"), (4, "ok")]
    assert all(OOM in a["error"] for a in search["attempts"][:2])
    rows = result["variants"]
    assert list(rows) == ["jax_mok", "jax_mok_fp8_block", "padded", "reference",
                          "jax_mok (own best batch)", "jax_mok_fp8_block (own best batch)"]
    for name in ("jax_mok", "jax_mok_fp8_block", "padded", "reference"):
        assert rows[name]["batch"] == 4 and rows[name]["at_shared_batch"], name
    assert rows["padded"]["status"] == "ok" and rows["padded"]["oom_batches"] == [16, 8]
    ref = rows["reference"]
    assert ref["status"] == "error" and ref["error"] == RAGGED
    assert ref["error_type"] == "JaxRuntimeError"
    own = rows["jax_mok (own best batch)"]
    assert own["own_best"] and own["batch"] == 16 and own["shared_batch"] == 4
    assert [(a["batch"], a["status"]) for a in own["batch_attempts"]] == [
        (4, "ok"), (8, "ok"), (16, "ok"), (32, "oom")]
    assert own["own_best_stop"] == "oom at batch 32"
    fp8_own = rows["jax_mok_fp8_block (own best batch)"]
    assert fp8_own["batch"] == 8
    # FP8 rows against jax_mok's row of the same policy
    assert rows["jax_mok_fp8_block"]["tokens_per_s_vs_jax_mok"] == pytest.approx(1.0)
    assert fp8_own["tokens_per_s_vs_jax_mok"] == pytest.approx((8 / 16) ** 0.5)

    saved = json.loads((tmp_path / "e2e.json").read_text())
    assert saved["batch_search"] == search and saved["batch_policy"] == "shared"
    text = (tmp_path / "e2e.md").read_text()
    assert f"| reference | 4 | - | - | - | - | - | - | error: {RAGGED}" in text
    assert "| jax_mok (own best batch) | 16 |" in text and "OWN BEST BATCH (shared batch 4" in text
    assert "at which padded runs: **4**" in text
    assert "| 1 | 16 | oom |" in text and "| 3 | 4 | ok |" in text
    assert (tmp_path / "e2e.png").stat().st_size > 0


def test_shared_batch_anchor_never_fits_and_gain_stop(tmp_path, monkeypatch):
    """An anchor that runs out of memory down to batch 1 leaves every variant at 1; the own-best
    search stops once doubling gains under --own-best-min-gain."""
    from benchmarks.e2e import run

    calls = []
    monkeypatch.setattr(run, "run_variant", _fake(calls, {"padded": 0, "jax_mok": 64}))
    result = _main(tmp_path, "--batch", "4", "--batch-policy", "shared", "--own-best",
                   "--own-best-min-gain", "0.5", "--variants", "jax_mok,padded")
    assert calls == [("padded", 4), ("padded", 2), ("padded", 1), ("jax_mok", 1),
                     ("jax_mok", 2)]  # sqrt(2) - 1 = 41 % < 50 %: stop, keep the faster
    assert result["batch"] == 1 and result["batch_search"]["anchor_status"] == "oom"
    assert result["variants"]["padded"]["status"] == "oom"
    own = result["variants"]["jax_mok (own best batch)"]
    assert own["batch"] == 2 and own["own_best_stop"].startswith("tokens/s gain 41.4 %")


def test_batch_policy_arguments(tmp_path):
    with pytest.raises(SystemExit):
        _main(tmp_path, "--own-best")  # needs --batch-policy shared
    with pytest.raises(SystemExit, match="anchor 'padded'"):
        _main(tmp_path, "--batch-policy", "shared", "--variants", "jax_mok")


def test_classify_hlo_scope_and_kernels():
    """Instructions in the e2e_moe scope (forward and transposed) and mok_* custom calls count as
    the MoE layers; a fusion without metadata takes its fused computation's."""
    import jax.numpy as jnp

    from benchmarks.e2e import breakdown

    def f(x, w):
        with jax.named_scope(breakdown.MOE_SCOPE):
            y = jnp.tanh(x @ w)
        return ((y + x) @ w.T).sum()

    x = jnp.ones((32, 32))
    hlo = jax.jit(jax.grad(f)).lower(x, x).compile().as_text()
    is_moe = breakdown.classify_hlo(hlo)
    assert any(is_moe.values()) and not all(is_moe.values())
    text = "\n".join([
        "%fused (p: f32[4]) -> f32[4] {",
        '  ROOT %t = f32[4]{0} tanh(%p), metadata={op_name="jit(s)/jvp(e2e_moe)/tanh"}',
        "}",
        "ENTRY %main (a: f32[4]) -> f32[4] {",
        "  %a = f32[4]{0} parameter(0)",
        "  %fusion.1 = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused",
        '  %custom-call.3 = f32[4]{0} custom-call(%fusion.1), custom_call_target="mok_gemm"',
        '  ROOT %add.2 = f32[4]{0} add(%custom-call.3, %a), metadata={op_name="jit(s)/add"}',
        "}",
    ])
    assert breakdown.classify_hlo(text) == {"t": True, "a": False, "fusion.1": True,
                                           "custom-call.3": True, "add.2": False}


def _check_breakdown(record):
    b = record["breakdown"]
    assert 0 <= b["moe_ms"] <= b["step_ms"] == record["step_ms_median"]
    assert b["moe_ms"] + b["rest_ms"] == pytest.approx(b["step_ms"])
    assert 0 <= b["moe_fraction"] <= 1
    return b


@pytest.mark.slow
def test_real_oom_halves_the_shared_batch_and_profile_breakdown(tmp_path, monkeypatch):
    """A real tiny run: the padded variant's step raises XLA's out-of-memory error at batch 2,
    so every variant runs at 1; --breakdown profiles each and attributes the MoE layers' ops."""
    from benchmarks.e2e import run

    def before_step(variant, batch):
        if variant == "padded" and batch > 1:
            raise _oom()

    monkeypatch.setattr(run, "_before_step", before_step)
    result = _main(tmp_path, "--seq", "16", "--batch", "2", "--steps", "2", "--warmup", "1",
                   "--batch-policy", "shared", "--breakdown", "--profile-steps", "2",
                   "--variants", "padded,jax_mok")
    assert [(a["batch"], a["status"]) for a in result["batch_search"]["attempts"]] == [
        (2, "oom"), (1, "ok")]
    for name in ("padded", "jax_mok"):
        record = result["variants"][name]
        assert record["status"] == "ok" and record["batch"] == 1, (name, record)
        b = _check_breakdown(record)
        assert b["method"] == "profile", b
        assert 0 < b["moe_op_ms_per_step"] <= b["device_op_ms_per_step"]
        assert b["moe_ops"] > 0 and b["top_moe_ops"]
    text = (tmp_path / "e2e.md").read_text()
    assert "| padded | 1 |" in text and "| profile |" in text


@pytest.mark.slow
def test_real_breakdown_differential_fallback(tmp_path, monkeypatch):
    """Where the profile cannot be read, the breakdown is the labelled differential measurement
    (the same model with identity MoE layers)."""
    from benchmarks.e2e import breakdown

    def unreadable(*args, **kwargs):
        raise ValueError("no HLO-op events")

    monkeypatch.setattr(breakdown, "op_times", unreadable)
    result = _main(tmp_path, "--seq", "16", "--batch", "1", "--steps", "2", "--warmup", "1",
                   "--breakdown", "--variants", "jax_mok")
    b = _check_breakdown(result["variants"]["jax_mok"])
    assert b["method"] == "differential" and "no HLO-op events" in b["reason"]
    assert b["no_moe_step_ms"] > 0
    assert "DIFFERENTIAL" in (tmp_path / "e2e.md").read_text()
