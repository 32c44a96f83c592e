"""Fail a CUDA build log on what ptxas says about the wgmma kernels' performance.

The extension is compiled with ``-Xptxas=-v`` (ffi/CMakeLists.txt), so a verbose build log
(``pip install -v ...``) holds, per kernel, ptxas's register and spill report and its
"Potential Performance Loss" notes. Two kinds of note undo a kernel's design without failing the
build or any CPU test, and are only visible on the GPU as lost time:

  C7510..C7520  wgmma serialized or a wait injected by ptxas (an accumulator read between a
                wgmma's issue and its retirement, registers it cannot prove free, ...)
  spills        a warp-specialized GEMM that spills its accumulators to local memory

    python tools/check_ptxas.py BUILD_LOG [--max-spill BYTES] [--allow-spills PATTERN ...]
    python tools/check_ptxas.py --compile UNIT.cu ... [--define NAME=VALUE ...] [...]

exits 1 and names each kernel (demangled when c++filt is present) with what ptxas said. With
--compile it builds the given translation units itself (nvcc -cubin -Xptxas=-v, the flags of
tools/ptx_compare.py; needs nvcc and the nvidia-cutlass headers) and checks their report: a build
variant that the extension's build does not compile (an experiment's CMake choice) stays checked.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_NOTE = re.compile(r"\((C75\d\d)\) (.*?)(?: in (?:the )?function '([^']+)')?\s*$")
# The kernels whose spills count: the wgmma GEMMs (BF16 and FP8), whose accumulators live in
# registers for a whole tile.
_GEMM = re.compile(r"gemm_kernel")


def _demangle(names: list[str]) -> dict[str, str]:
    if not names or shutil.which("c++filt") is None:
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=False).stdout.splitlines()
    if len(out) != len(names):
        return {n: n for n in names}
    return dict(zip(names, out, strict=True))


def findings(log: str, allow_spills: list[str] | None = None,
             max_spill: int = 0) -> list[tuple[str, str]]:
    """(kernel, what ptxas said) for every C75xx note and every GEMM kernel in ``log`` (the text
    of a build log with ptxas -v output) that stores more than ``max_spill`` bytes of spills."""
    allow = [re.compile(p) for p in (allow_spills or [])]
    found: list[tuple[str, str]] = []
    current = None  # the function whose properties follow
    for line in log.splitlines():
        if m := _NOTE.search(line):
            code, text, fn = m.groups()
            found.append((fn or current or "?", f"{code} {text.strip()}"))
            continue
        if m := _ENTRY.search(line):
            current = m.group(1)
            continue
        if m := _PROPS.search(line):
            current = m.group(1)
            continue
        if (m := _SPILL.search(line)) and current and _GEMM.search(current):
            stores, loads = int(m.group(1)), int(m.group(2))
            if stores > max_spill and not any(a.search(current) for a in allow):
                found.append((current, f"spills: {stores} bytes stored, {loads} loaded"))
    return found


def compile_report(units: list[str], defines: list[str]) -> str:
    """ptxas -v's report of ``units`` compiled (sm_90a cubins, discarded) with ``-D`` of each of
    ``defines``, in the order of ``units``; a unit that does not compile raises with its errors."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ptx_compare import include_flags  # noqa: PLC0415 (nvcc's flags: one place)

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def one(unit: str, tmp: str) -> str:
        cmd = ["nvcc", *include_flags(), f"-I{root}/ffi", "-O3", "-DNDEBUG", "-std=c++17",
               "-arch=sm_90a", "--expt-relaxed-constexpr", "-Xptxas=-v",
               *(f"-D{d}" for d in defines), "-cubin", unit,
               "-o", os.path.join(tmp, os.path.basename(unit) + ".cubin")]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc failed on {unit}:\n{done.stdout}{done.stderr}")
        return done.stdout + done.stderr

    with tempfile.TemporaryDirectory() as tmp, \
            concurrent.futures.ThreadPoolExecutor(max(1, len(units))) as pool:
        return "".join(pool.map(lambda u: one(u, tmp), units))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", nargs="?", help="a build log with ptxas -v output")
    ap.add_argument("--compile", nargs="+", metavar="UNIT", default=[],
                    help="compile these .cu files and check their report instead of a log")
    ap.add_argument("--define", nargs="*", default=[], metavar="NAME=VALUE",
                    help="with --compile: preprocessor definitions")
    ap.add_argument("--max-spill", type=int, default=0,
                    help="spill-store bytes a GEMM kernel may have (default 0)")
    ap.add_argument("--allow-spills", nargs="*", default=[],
                    help="regular expressions of mangled kernel names allowed to spill")
    args = ap.parse_args(argv)
    if (args.log is None) == (not args.compile):
        ap.error("give a build log or --compile UNIT ..., not both")
    if args.compile:
        text = compile_report(args.compile, args.define)
        args.log = "the --compile report"
    else:
        with open(args.log, errors="replace") as f:
            text = f.read()
    kernels = len(set(_ENTRY.findall(text)))
    if kernels == 0:
        print(f"check_ptxas: no ptxas -v output in {args.log} (build with -v?)", file=sys.stderr)
        return 1
    found = findings(text, args.allow_spills, args.max_spill)
    names = _demangle(sorted({k for k, _ in found}))
    seen = set()
    for kernel, what in found:
        if (kernel, what) in seen:
            continue
        seen.add((kernel, what))
        print(f"{names.get(kernel, kernel)}\n    {what}")
    print(f"check_ptxas: {kernels} kernels, {len(seen)} findings")
    return 1 if seen else 0


if __name__ == "__main__":
    sys.exit(main())
