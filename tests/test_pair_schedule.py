"""The routed-M GEMMs' 2-CTA pair schedule (ffi/cuda/device/cluster.cuh: pair_tiles,
pair_total_tiles, decode_pair_routed) checked on the CPU by tests/cuda/pair_schedule_test.cu,
compiled with nvcc as host code: every tile of the single-CTA schedule covered exactly once, with
its rows, by the pairs' two ranks (the kernels that use it are a build option until they run on
a GPU: docs/bench/2026-12-05-r28/)."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_pair_schedule_covers_every_tile_once(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    exe = tmp_path / "pair_schedule_test"
    subprocess.run(["nvcc", "-std=c++17", "-O1", f"-I{ROOT}/ffi",
                    os.path.join(ROOT, "tests", "cuda", "pair_schedule_test.cu"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "400 cases ok" in run.stdout
