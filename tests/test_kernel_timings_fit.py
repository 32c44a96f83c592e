"""tools/kernel_timings.py fit: per-tile and per-stage cost of each GEMM phase from profiles of
derived shapes that change one phase's K at a fixed tile count."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))

import kernel_timings as kt  # noqa: E402


def test_derived_shapes_replace_dimensions_and_reject_unknown_letters():
    s = kt.shape("S1-H4096-F384")
    assert (s.tokens, s.hidden, s.ffn, s.experts, s.top_k) == (32768, 4096, 384, 128, 8)
    assert s.name == "S1-H4096-F384"
    with pytest.raises(ValueError, match="'X3' is not one of"):
        kt.shape("S1-X3")
    with pytest.raises(ValueError, match="unknown shape 'S9'"):
        kt.shape("S9-H1024")


def test_fit_recovers_the_per_tile_and_per_stage_cost_of_a_linear_model():
    # gate/up of S1 with H = K in {1024, 2048, 4096}: 2048 m-tiles x 6 n-tiles, and a made-up
    # cost of 3 us per tile plus 1.2 us per 128-K stage per tile (fp8), 0.9 us per 64-K (bf16)
    tiles, waves = 12288, 12288 / kt.SMS
    profiles = {}
    for h in (1024, 2048, 4096):
        name = f"S1-H{h}" if h != 2048 else "S1"
        fp8_ms = waves * (3.0 + 1.2 * h / 128) / 1e3
        bf16_ms = waves * (2.0 + 0.9 * h / 64) / 1e3
        profiles[f"{name}:fp8_block"] = [("fp8 gate/up GEMM + SwiGLU", fp8_ms),
                                         ("routing", 0.1)]
        profiles[name] = [("gate/up GEMM + SwiGLU (h saved)", bf16_ms)]
    rows = {r["phase"]: r for r in kt.fit_stages(profiles, {"bf16": 738.0, "fp8": 1400.0})}
    assert set(rows) == {"fp8 gate/up GEMM + SwiGLU", "gate/up GEMM + SwiGLU (h saved)"}
    fp8, bf16 = rows["fp8 gate/up GEMM + SwiGLU"], rows["gate/up GEMM + SwiGLU (h saved)"]
    assert fp8["tiles"] == bf16["tiles"] == tiles and fp8["k"] == [1024, 2048, 4096]
    assert fp8["tile_us"] == pytest.approx(3.0) and fp8["stage_us"] == pytest.approx(1.2)
    assert bf16["tile_us"] == pytest.approx(2.0) and bf16["stage_us"] == pytest.approx(0.9)
    # the ideal stage: 2 * 128 * 256 * BK FLOPs at the ceiling shared by 132 SMs
    assert fp8["ideal_stage_us"] == pytest.approx(2 * 128 * 256 * 128 / (1400e12 / 132) * 1e6)
    assert fp8["stage_efficiency"] == pytest.approx(fp8["ideal_stage_us"] / 1.2)
    assert fp8["worst_residual"] < 1e-9


def test_a_phase_whose_tile_count_changes_is_not_fitted_across_runs():
    # down GEMM tiles grow with H: S1-H1024 and S1 have different tile counts, no fit
    profiles = {"S1-H1024": [("down GEMM x weight", 0.7)], "S1": [("down GEMM x weight", 1.4)]}
    assert kt.fit_stages(profiles, {"bf16": 738.0, "fp8": 1400.0}) == []


def test_read_profile_stops_at_the_end_marker(tmp_path):
    """The next shape's first call quantizes its weights before it routes: without the end
    marker those phases were read as the previous shape's."""
    END_MARK, PHASE = kt.END_MARK, kt.PHASE
    lines = [f"{PHASE}routing 0.1 ms", "--- S1:fp8_block T=1 (second call below)",
             f"{PHASE}quantize expert weights 0.3 ms", f"{PHASE}routing 0.1 ms",
             f"{PHASE}fp8 gate/up GEMM + SwiGLU 2.2 ms", f"{PHASE}routing 0.1 ms",
             f"{END_MARK}S1:fp8_block", f"{PHASE}quantize expert weights 5.7 ms",
             f"{PHASE}routing 0.1 ms"]
    path = tmp_path / "profile.log"
    path.write_text("\n".join(lines) + "\n")
    phases = kt.read_profile(str(path))["S1:fp8_block"]
    assert [name for name, _ in phases] == ["quantize expert weights", "routing",
                                            "fp8 gate/up GEMM + SwiGLU", "routing"]
    assert sum(ms for _, ms in phases) == pytest.approx(2.7)
