"""Every example runs (small flags) and does what it says; plus the tiny LM's checkpoint round trip.

The examples are imported and their ``main(argv)`` called in a subprocess each (they set up JAX
devices and flags of their own).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _run_main(script: str, argv: list[str], tmp_path: pathlib.Path) -> dict:
    """Runs ``examples/<script>.main(argv)`` in a fresh interpreter; returns its result."""
    out = tmp_path / "result.json"
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        f"import {script} as m; r = m.main(sys.argv[3:]); "
        "json.dump(r, open(sys.argv[2], 'w'), default=str)"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", code, str(EXAMPLES), str(out), *argv],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text())


def test_quickstart(tmp_path):
    result = _run_main("quickstart", ["--tokens", "64", "--hidden", "32", "--ffn", "16"], tmp_path)
    assert result["relative_difference"] < 1e-4


def test_expert_parallel(tmp_path):
    result = _run_main("expert_parallel", ["--tokens", "128", "--hidden", "32", "--ffn", "16",
                                           "--ep", "2", "8"], tmp_path)
    assert set(result) == {"2", "8"}
    for y_diff, grad_diff in result.values():
        assert y_diff < 1e-4 and grad_diff < 1e-4


def test_train_tiny_moe_lm_and_checkpoint_round_trip(tmp_path):
    plot = tmp_path / "plot.png"
    result = _run_main("train_tiny_moe_lm", [
        "--steps", "40", "--hidden", "32", "--ffn", "32", "--layers", "1", "--seq-len", "32",
        "--log-every", "20", "--plot", str(plot), "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--routing", "sigmoid", "--capacity-factor", "1.0",
    ], tmp_path)
    losses = result["losses"]
    assert losses[-1] < losses[0] - 1.0, f"loss did not fall: {losses[0]} -> {losses[-1]}"
    # The orbax checkpoint restores to a model with exactly the same validation loss.
    assert result["restored_loss"] == result["valid_loss"]
    assert (tmp_path / "ckpt" / "tiny_moe_lm").is_dir()
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"
    assert sum(result["dropped"]) > 0  # capacity_factor=1.0: drops are counted and reported


def test_hf_qwen3_moe(tmp_path):
    result = _run_main("hf_qwen3_moe", ["--layers", "1", "--tokens", "32"], tmp_path)
    (layer,) = result.values()
    assert layer["round_trip"] is True
    assert layer["relative_difference"] < 1e-2  # bfloat16 layer vs float32 reference


def test_fp8_training_tracks_bf16(tmp_path):
    """The tiny LM with mxfp8 / fp8_block experts ends within 2 % of the bf16 run's loss (same
    seed, data, steps; the final loss is the mean of the last 10 steps' train losses)."""
    plot = tmp_path / "fp8.png"
    result = _run_main("fp8_tiny_moe_lm", [
        "--steps", "40", "--hidden", "32", "--ffn", "32", "--layers", "1", "--seq-len", "32",
        "--log-every", "20", "--tail", "10", "--plot", str(plot),
    ], tmp_path)
    base = result["bf16"]
    assert base["final_loss"] < base["losses"][0] - 1.0, "the bf16 run did not train"
    for name in ("mxfp8", "fp8_block"):
        change = result[name]["final_loss"] / base["final_loss"] - 1
        assert abs(change) < 0.02, f"{name}: final loss {100 * change:+.2f} % vs bf16"
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_fp8_weights_microbatches(tmp_path):
    result = _run_main("fp8_weights_microbatches", [
        "--layers", "2", "--micro-batches", "3", "--tokens", "32", "--hidden", "128",
        "--ffn", "128", "--experts", "4", "--steps", "2"], tmp_path)
    assert result["gradient_difference"] < 1e-5 and result["finite"]
    assert result["losses"][-1] < result["losses"][0]
