"""tools/check_ptxas.py: ptxas's serialization notes and GEMM spills in a build log are found and
attributed to their kernel; a clean log passes. (The log lines follow ptxas -v's format as the
extension's build prints it.)"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))

import check_ptxas  # noqa: E402

GEMM = "_ZN3mok4cuda3fp815fp8_gemm_kernelILNS1_6RecipeE2EEEvNS1_13Fp8GemmParamsE"
OTHER = "_ZN3mok4cuda3fp820quantize_rows_kernelIfLNS1_6RecipeE2EEEvPKT_"


def entry(name, stores=0, loads=0):
    return (f"ptxas info    : Compiling entry function '{name}' for 'sm_90a'\n"
            f"ptxas info    : Function properties for {name}\n"
            f"    0 bytes stack frame, {stores} bytes spill stores, {loads} bytes spill loads\n"
            "ptxas info    : Used 168 registers, used 2 barriers\n")


def test_a_clean_log_has_no_findings(tmp_path):
    log = entry(GEMM) + entry(OTHER)
    assert check_ptxas.findings(log) == []
    path = tmp_path / "build.log"
    path.write_text(log)
    assert check_ptxas.main([str(path)]) == 0


def test_serialization_notes_are_attributed_to_their_kernel(tmp_path):
    log = entry(GEMM) + (
        "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
        "serialized due to non wgmma instructions reading accumulator registers of  a wgmma "
        f"between start and end of the pipeline stage in the function '{GEMM}'\n"
        "ptxas info    : (C7517) warpgroup.wait is injected in around line 1737 by compiler to "
        f"allow use of registers defined by GMMA in function '{GEMM}'\n") + entry(OTHER)
    found = check_ptxas.findings(log)
    assert [(k, w.split()[0]) for k, w in found] == [(GEMM, "C7514"), (GEMM, "C7517")]
    path = tmp_path / "build.log"
    path.write_text(log)
    assert check_ptxas.main([str(path)]) == 1


def test_spills_count_in_gemm_kernels_only_and_can_be_allowed():
    log = entry(GEMM, 624, 598) + entry(OTHER, 16, 16)
    found = check_ptxas.findings(log)
    assert found == [(GEMM, "spills: 624 bytes stored, 598 loaded")]
    assert check_ptxas.findings(log, allow_spills=["Recipe"]) == []
    assert check_ptxas.findings(log, max_spill=624) == []


def test_a_log_without_ptxas_output_fails(tmp_path):
    path = tmp_path / "build.log"
    path.write_text("-- Configuring done\n")
    assert check_ptxas.main([str(path)]) == 1


def test_compile_mode_builds_units_with_the_defines_and_checks_them(tmp_path):
    """--compile: the units are compiled with each --define, and what ptxas says of them decides
    (here a define that makes a GEMM kernel's accumulator array spill). Needs nvcc and the
    nvidia-cutlass headers (tools/ptx_compare.py's flags)."""
    import shutil

    import pytest
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    pytest.importorskip("cutlass_library")
    unit = tmp_path / "unit.cu"
    unit.write_text(  # N values live at once, in at most 32 registers: N = 96 spills
        "#ifndef N\n#define N 1\n#endif\n"
        "__global__ void __launch_bounds__(1024, 2) toy_gemm_kernel(float* out) {\n"
        "  float v[N];\n"
        "#pragma unroll\n"
        "  for (int i = 0; i < N; ++i) v[i] = out[i * blockDim.x + threadIdx.x];\n"
        "  float s = 0.f;\n"
        "#pragma unroll\n"
        "  for (int i = 0; i < N; ++i) s += v[i] * v[N - 1 - i];\n"
        "#pragma unroll\n"
        "  for (int i = 0; i < N; ++i) out[i * blockDim.x + threadIdx.x] = v[i] * s;\n"
        "}\n")
    assert check_ptxas.main(["--compile", str(unit)]) == 0
    assert check_ptxas.main(["--compile", str(unit), "--define", "N=96"]) == 1
