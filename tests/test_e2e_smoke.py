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


@pytest.fixture(scope="module")
def all_variants(tmp_path_factory):
    """One tiny run of every variant, shared by the tests below (each variant compiles its own
    training step, 15-60 s apiece on 2 CPU cores; the tests used to run jax_mok and
    jax_mok_fp8_block three times over). ``jax_mok.fp8_weights`` is counted during the run:
    ``(out, result, calls)``."""
    import jax.numpy as jnp

    import jax_mok

    out = tmp_path_factory.mktemp("e2e")
    calls = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        real = getattr(jax_mok, "fp8_weights", None)
        if real is not None:
            def counting_fp8_weights(params, **kwargs):
                calls.append((params.w_gate_up.shape, jnp.dtype(kwargs.get("dtype")).name))
                return real(params, **kwargs)

            monkeypatch.setattr(jax_mok, "fp8_weights", counting_fp8_weights)
        result = _run(out)
    return out, result, calls


def _check(result, tmp_path):
    for name, record in result["variants"].items():
        if record["status"] == "skipped":  # a variant this jax_mok cannot run, with the reason
            assert "not available in this jax_mok" in record["error"], (name, record)
            continue
        assert record["status"] == "ok", (name, record)
        assert record["tokens_per_s"] > 0 and 0 < record["mfu"] < 1, (name, record)
        assert all(loss == loss for loss in record["losses"]), name  # no NaN
    saved = json.loads((tmp_path / "e2e.json").read_text())
    assert saved["flops_per_token"] == result["flops_per_token"]
    assert (tmp_path / "e2e.png").stat().st_size > 0


def test_e2e_tiny_jax_mok(all_variants):
    """The CI smoke run: the jax_mok variant, one layer (one compiled step)."""
    out, result, _ = all_variants
    _check(result, out)
    assert result["variants"]["jax_mok"]["status"] == "ok"
    assert "| jax_mok | 2 |" in (out / "e2e.md").read_text()


def test_e2e_tiny_fp8_block_mfu_counts_bf16_flops(all_variants):
    """The FP8 variant trains one tiny step (the pure-JAX FP8 layer on the CPU) and its MFU is
    the BF16 model's FLOPs over the BF16 matmul ceiling, like every variant's."""
    from benchmarks.e2e import model as m

    tmp_path, result, _ = all_variants
    _check(result, tmp_path)
    record = result["variants"]["jax_mok_fp8_block"]
    assert record["status"] == "ok"
    assert record["quantization"] == "fp8_block" and not record["fp8_weights_per_step"]
    assert record["fp8_path"].startswith("pure-jax")
    assert result["config"]["quantization"] is None  # the run's model: the BF16 one
    bf16_flops = m.ModelConfig(**result["config"]).flops_per_token()["train"]
    assert record["flops_per_token"] == result["flops_per_token"] == bf16_flops
    assert record["mfu"] == pytest.approx(
        record["tokens_per_s"] * bf16_flops / (result["ceiling_tflops"] * 1e12))
    assert record["final_loss"] == record["losses"][-1]
    text = (tmp_path / "e2e.md").read_text()
    assert "| jax_mok_fp8_block | 2 |" in text
    assert "FP8 GEMMs are counted as BF16 FLOPs" in text


def test_e2e_prepared_variant_needs_fp8_weights(tmp_path, monkeypatch):
    """Without jax_mok.fp8_weights the prepared variant is skipped with its reason (nothing
    compiled), and preparing the weights raises it."""
    import jax_mok
    from benchmarks.e2e import model as m
    from benchmarks.e2e import run

    monkeypatch.delattr(jax_mok, "fp8_weights", raising=False)
    calls = []

    def fake_run_variant(variant, cfg, args, batch, mesh, attention, ceiling, n_devices):
        calls.append(variant)
        return {"variant": variant, "status": "ok", "batch": batch, "step_ms_median": 1.0,
                "tokens_per_s": 1e3, "mfu": 0.1, "losses": [5.0]}

    monkeypatch.setattr(run, "run_variant", fake_run_variant)
    result = run.main(["--tiny", "--layers", "1", "--variants",
                       "jax_mok,jax_mok_fp8_block_prepared", "--out", str(tmp_path)])
    assert calls == ["jax_mok"]
    record = result["variants"]["jax_mok_fp8_block_prepared"]
    assert record["status"] == "skipped"
    assert "not available in this jax_mok" in record["error"]
    assert "| jax_mok_fp8_block_prepared | 8 | - |" in (tmp_path / "e2e.md").read_text()
    with pytest.raises(NotImplementedError, match="not available in this jax_mok"):
        m.prepare_fp8_weights(None)


@pytest.mark.slow
def test_e2e_prepared_variant_passes_fp8_weights(all_variants):
    """The prepared variant makes the FP8 weights once per step for every layer (one traced call
    of jax_mok.fp8_weights, vmapped over the stacked layers, from the bf16 compute dtype) and
    trains exactly like the variant that quantizes in every call: the same losses. (No other
    variant calls jax_mok.fp8_weights, so the run's calls are the prepared variant's.)"""
    import jax_mok

    assert hasattr(jax_mok, "fp8_weights")
    tmp_path, result, calls = all_variants
    _check(result, tmp_path)
    plain = result["variants"]["jax_mok_fp8_block"]
    record = result["variants"]["jax_mok_fp8_block_prepared"]
    assert plain["status"] == record["status"] == "ok"
    assert record["quantization"] == "fp8_block" and record["fp8_weights_per_step"]
    E, H, F = (result["config"][k] for k in ("experts", "hidden", "ffn"))
    assert calls == [((E, H, 2 * F), "bfloat16")]  # traced once: vmapped over the layers
    assert record["losses"] == plain["losses"]


@pytest.mark.slow
def test_e2e_tiny_all_variants(all_variants):
    import jax_mok

    tmp_path, result, _ = all_variants
    assert list(result["variants"]) == ["jax_mok", "jax_mok_fp8_block", "jax_mok_mxfp8",
                                        "jax_mok_fp8_block_prepared", "padded", "reference"]
    _check(result, tmp_path)
    prepared = result["variants"]["jax_mok_fp8_block_prepared"]["status"]
    assert prepared == ("ok" if hasattr(jax_mok, "fp8_weights") else "skipped")
    ran = {n: r for n, r in result["variants"].items() if r["status"] == "ok"}
    # One seed, one model: the first loss agrees across variants (bf16 layers: 1e-2; the FP8
    # layers' expert outputs differ by a few %, inside the same bound on the loss).
    first = [r["losses"][0] for r in ran.values()]
    assert max(first) - min(first) < 1e-2 * abs(first[0])
    for name in ("jax_mok_fp8_block", "jax_mok_mxfp8"):
        assert ran[name]["tokens_per_s_vs_jax_mok"] == pytest.approx(
            ran[name]["tokens_per_s"] / ran["jax_mok"]["tokens_per_s"])
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
    assert "| reference | 4 | - | - | - | - | - | - | oom: RESOURCE_EXHAUSTED" in (
        tmp_path / "e2e.md").read_text()

    calls.clear()
    monkeypatch.setattr(run, "_auto_attention", lambda platform: "cudnn")
    result = run.main(["--tiny", "--layers", "1", "--variants", "jax_mok", "--out",
                       str(tmp_path)])
    assert calls == [("jax_mok", 8, "cudnn"), ("jax_mok", 8, "xla")]
    assert result["attention"] == "xla (cuDNN failed)"
    assert result["variants"]["jax_mok"]["status"] == "ok"


def test_micro_batches_average_the_per_micro_batch_losses_and_gradients():
    """``accumulated_value_and_grad`` (``--micro-batches``): the mean of what each micro-batch
    alone gives, through one lax.scan."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from benchmarks.e2e import model as m

    cfg = m.ModelConfig(layers=1, hidden=64, ffn=32, experts=8, top_k=2, heads=4, kv_heads=2,
                        head_dim=16, vocab=256, seq=16)
    model = m.MoETransformer(cfg, m.moe_fn_for("jax_mok"), attention="xla", remat=False,
                             rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab, (3, 2, cfg.seq + 1)),
                         jnp.int32)
    loss, grads, dropped = jax.jit(m.accumulated_value_and_grad, static_argnums=2)(
        model, tokens, cfg.aux_loss_weight)
    grad_fn = nnx.jit(nnx.value_and_grad(m.loss_fn, has_aux=True), static_argnums=2)
    each = [grad_fn(model, tokens[i], cfg.aux_loss_weight) for i in range(3)]
    np.testing.assert_allclose(loss, np.mean([float(v) for (v, _), _ in each]), rtol=1e-3)
    assert int(dropped) == sum(int(metrics["dropped"].sum()) for (_, metrics), _ in each)
    want = jax.tree.map(lambda *g: sum(g) / 3, *[g for _, g in each])

    def worst(got):  # the largest leaf-wise difference, relative to the leaf's largest entry
        return max(jax.tree.leaves(jax.tree.map(
            lambda a, b: float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30)),
            got, want)))

    # bf16 activations: one micro-batch's gradient computed in a scan or alone differs by up to
    # ~1.5 % of a leaf's largest entry (measured on the CPU); one micro-batch's gradient alone,
    # or the sum instead of the mean, is far outside that
    assert worst(grads) < 0.05, worst(grads)
    assert worst(each[0][1]) > 0.2 and worst(jax.tree.map(lambda g: 3 * g, grads)) > 1
