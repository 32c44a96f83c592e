"""Count SASS instructions per kernel in a built extension, on the CPU machine.

A prebuilt `_mok_cuda*.so` carries its device code as sm_90a cubins inside the fatbin. This tool
cuts them out (every embedded ELF whose machine is EM_CUDA) and, where `nvdisasm` is available
(`pip download nvidia-cuda-nvdisasm`: its wheel holds the binary; set NVDISASM or put it on
PATH), prints for every kernel whose name matches --kernel the number of instructions matching
each --count pattern. It answers, before any device time is spent, whether a build holds the code
an A/B means to measure — e.g. that an experimental build still has its QGMMAs (ptxas deletes
wgmmas whose results nothing reads) — and, against the SASS of an ncu report, which build a
profiled process actually ran.

    python tools/cubin_sass.py .device/ext-x/_mok_cuda*.so --kernel fp8_gemm --count QGMMA FFMA
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

EM_CUDA = 190


def cubins(blob: bytes) -> list[bytes]:
    """The 64-bit little-endian ELF images with e_machine EM_CUDA embedded in `blob`, each cut
    at the end of its furthest section, program header table or section header table."""
    out = []
    i = blob.find(b"\x7fELF")
    while i >= 0:
        if (i + 64 <= len(blob) and blob[i + 4] == 2 and blob[i + 5] == 1
                and struct.unpack_from("<H", blob, i + 18)[0] == EM_CUDA):
            phoff, shoff = struct.unpack_from("<QQ", blob, i + 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, i + 0x36)
            end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
            for k in range(shnum):
                o = i + shoff + k * shentsize
                if o + 0x28 > len(blob):
                    break
                sh_type = struct.unpack_from("<I", blob, o + 4)[0]
                off, size = struct.unpack_from("<QQ", blob, o + 0x18)
                if sh_type != 8:  # SHT_NOBITS occupies no bytes in the file
                    end = max(end, off + size)
            if i + end <= len(blob):
                out.append(blob[i:i + end])
        i = blob.find(b"\x7fELF", i + 1)
    return out


_FUNC = re.compile(r"^\s*\.text\.(\S+):|^\s*\.section\s+\.text\.([^,\s]+)")


def counts_per_kernel(sass: str, kernel: str, patterns: list[str]) -> dict[str, dict[str, int]]:
    """{kernel name: {pattern: count}} over nvdisasm's listing, for names containing `kernel`."""
    res: dict[str, dict[str, int]] = {}
    current = None
    regs = [re.compile(p) for p in patterns]
    for line in sass.splitlines():
        m = _FUNC.match(line)
        if m:
            name = m.group(1) or m.group(2)
            current = name if kernel in name else None
            if current is not None:
                res.setdefault(current, {p: 0 for p in patterns})
            continue
        if current is not None:
            for p, r in zip(patterns, regs, strict=True):
                if r.search(line):
                    res[current][p] += 1
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("extension", help="a built _mok_cuda*.so")
    ap.add_argument("--kernel", default="gemm_kernel", help="substring of the mangled kernel names")
    ap.add_argument("--count", nargs="+", default=["QGMMA", "HGMMA", "FFMA"],
                    help="regular expressions counted per kernel")
    args = ap.parse_args()
    with open(args.extension, "rb") as f:
        images = cubins(f.read())
    print(f"{args.extension}: {len(images)} cubins")
    tool = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if tool is None:
        sys.exit("nvdisasm not found: set NVDISASM (pip download nvidia-cuda-nvdisasm; the wheel "
                 "holds nvidia/*/bin/nvdisasm)")
    with tempfile.TemporaryDirectory() as d:
        for n, image in enumerate(images):
            path = os.path.join(d, f"c{n}.cubin")
            with open(path, "wb") as f:
                f.write(image)
            run = subprocess.run([tool, path], capture_output=True, text=True, check=False)
            if run.returncode != 0:
                print(f"cubin {n}: nvdisasm failed: {run.stderr.strip()[:200]}")
                continue
            for name, c in sorted(counts_per_kernel(run.stdout, args.kernel, args.count).items()):
                print(f"{name}: " + ", ".join(f"{p} {v}" for p, v in c.items()))


if __name__ == "__main__":
    main()
