"""Fail a CUDA build log on what ptxas says about the wgmma kernels' performance.

The extension is compiled with ``-Xptxas=-v`` (ffi/CMakeLists.txt), so a verbose build log
(``pip install -v ...``) holds, per kernel, ptxas's register and spill report and its
"Potential Performance Loss" notes. Two kinds of note undo a kernel's design without failing the
build or any CPU test, and are only visible on the GPU as lost time:

  C7510..C7520  wgmma serialized or a wait injected by ptxas (an accumulator read between a
                wgmma's issue and its retirement, registers it cannot prove free, ...)
  spills        a warp-specialized GEMM that spills its accumulators to local memory

    python tools/check_ptxas.py BUILD_LOG [--max-spill BYTES] [--allow-spills PATTERN ...]

exits 1 and names each kernel (demangled when c++filt is present) with what ptxas said.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="a build log with ptxas -v output")
    ap.add_argument("--max-spill", type=int, default=0,
                    help="spill-store bytes a GEMM kernel may have (default 0)")
    ap.add_argument("--allow-spills", nargs="*", default=[],
                    help="regular expressions of mangled kernel names allowed to spill")
    args = ap.parse_args(argv)
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
