"""examples/multihost_train.py with 2 CPU processes over localhost (jax.distributed + gloo).

Checks that both processes train the same model on a data x expert mesh: the loss falls and the
replicated parameters end bitwise-equal (same checksum) on both processes.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "examples" / "multihost_train.py"
RESULT = re.compile(
    r"\[process (\d)/2\] RESULT first_loss=(\S+) last_loss=(\S+) "
    r"replicated_checksum=(\S+) replicated_leaves=(\d+) expert_sharded_leaves=(\d+)"
)


@pytest.mark.slow
def test_two_processes_train_and_agree():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # each process sets its own CPU device count
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--launch", "2", "--steps", "15", "--log-every", "5"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    results = {int(m[0]): m[1:] for m in RESULT.findall(output)}
    assert sorted(results) == [0, 1], output[-4000:]
    for first, last, _, replicated, sharded in results.values():
        assert float(last) < float(first) - 0.5, f"loss did not fall: {first} -> {last}"
        assert int(replicated) > 0 and int(sharded) == 4  # 2 layers x (w_gate_up, w_down)
    assert results[0] == results[1], f"processes disagree: {results}"
