"""mxfp8 as bf16 (ffi/cuda/device/fp8_format.cuh; the kernels' kMxBf16, CMake JAX_MOK_MX_BF16)
checked on the CPU by tests/cuda/mx_bf16_test.cu, compiled with nvcc as host code: every E4M3 byte
to bf16 and every E8M0 scale's factors exact, the scaled values exactly v * 2^e, and the bf16 slots'
byte offsets those of CuTe's layout that the wgmma descriptors read."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_mx_bf16_conversion_and_layout(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    cutlass_library = pytest.importorskip("cutlass_library")
    cutlass = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
    exe = tmp_path / "mx_bf16_test"
    done = subprocess.run(["nvcc", "-std=c++17", "-O1", "--expt-relaxed-constexpr",
                           f"-I{ROOT}/ffi", "-isystem", cutlass,
                           os.path.join(ROOT, "tests", "cuda", "mx_bf16_test.cu"), "-o", str(exe)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("ok:"), run.stdout
