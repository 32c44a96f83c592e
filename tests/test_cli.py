"""``python -m jax_mok``: --version, --help, info's CUDA section and settings, bench's progress."""

from __future__ import annotations

import io
import re
import types

import pytest

import jax_mok
from jax_mok import __main__ as cli
from jax_mok import tuning
from jax_mok.kernels import _ffi


def _run(capsys, *argv) -> tuple[int, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exit_:  # --version and --help exit through argparse
        code = exit_.code
    return code, capsys.readouterr().out


def test_version(capsys):
    code, out = _run(capsys, "--version")
    assert code == 0 and out.strip().startswith(f"jax_mok {jax_mok.__version__} (jax ")


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["check", "--help"],
                                  ["info", "--help"]])
def test_help_is_plain_text_with_defaults_and_choices(capsys, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps to the terminal width
    code, out = _run(capsys, *argv)
    assert code == 0
    assert "``" not in out and ":func:" not in out and ":mod:" not in out  # no reST markup
    if argv[0] in ("bench", "check"):
        assert "(default: qwen3-30b-a3b)" in out and "(default: 1024)" in out
        assert "{deepseek-v3,mixtral-8x7b,qwen3-30b-a3b,tiny}" in out
        assert "{bfloat16,float32}" in out
    if argv == ["--help"]:
        for command in ("info", "bench", "check"):
            assert re.search(rf"^\s+{command}\s+\S", out, re.M), out


def test_bad_arguments_are_argparse_errors(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--tokens", "0"])
    assert exit_.value.code == 2
    assert "expected an integer >= 1, got 0" in capsys.readouterr().err


def test_info_cuda_section_is_readable(capsys, monkeypatch):
    fake = types.SimpleNamespace(device_info=lambda: {
        "compiled_arch": "sm_90a", "wgmma_path": True, "gemm_path_env": "ignored"})
    monkeypatch.setattr(_ffi, "cuda_module", lambda: fake)
    lines = cli._cuda_section()
    assert lines[0] == "CUDA kernels    : built"
    assert "  compiled for  : sm_90a" in lines
    assert any(line.startswith("  GEMM path     : wgmma") for line in lines)
    assert not any("{" in line for line in lines)  # no raw dict
    monkeypatch.setattr(_ffi, "cuda_module", lambda: None)
    assert cli._cuda_section()[0].startswith("CUDA kernels    : not built")


def test_info_lists_every_setting_with_value_and_source(capsys, monkeypatch):
    monkeypatch.setenv("JAX_MOK_TRANSPORT", "xla")
    code, out = _run(capsys, "info")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.startswith("  ") and line.split() and (
                line.split()[0] in tuning.REGISTRY or line.split()[0].startswith("tuning."))}
    assert set(tuning.REGISTRY) <= set(rows)
    assert rows["JAX_MOK_TRANSPORT"][1:3] == ["xla", "env"]
    assert rows["tuning.peer.copy"][1:3] == ["'ce'", "default"]
    assert "CUDA kernels" in out


def test_bench_reports_progress_in_plain_lines_when_piped(capsys):
    stream = io.StringIO()  # not a TTY
    args = cli.parser().parse_args(["bench", "--preset", "tiny", "--tokens", "32", "--iters", "2",
                                    "--implementation", "reference"])
    code = cli.cmd_bench(args, report=cli.Reporter(stream))
    out = stream.getvalue()
    assert code == 0, out
    assert "\r" not in out
    lines = out.splitlines()
    # A phase line comes before the first compilation, and each timed run has its own line.
    assert lines[2].startswith("  [") and "building the inputs" in lines[2]
    assert [ln for ln in lines if ln.startswith("  timing ")] == [
        ln for ln in lines if re.fullmatch(r"  timing [12]/2: [\d.]+ ms", ln)]
    assert len([ln for ln in lines if ln.startswith("  timing ")]) == 2
    assert lines[-1] == "  reference check: PASSED"


def test_progress_redraws_one_line_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    report = cli.Reporter(stream)
    for i in range(3):
        report.progress("timing", i + 1, 3, "1.00 ms")
    out = stream.getvalue()
    assert out.count("\r") == 3 and out.endswith("\n") and out.count("\n") == 1
