"""Are the device kernels of two trees the same code? Compares the PTX of every kernel entry.

    python3 tools/ptx_compare.py OLD_COMMIT [NEW_TREE=.]   # needs nvcc and the CUTLASS headers

Builds the PTX of ffi/cuda/forward.cu and backward.cu for sm_90a from a worktree of OLD_COMMIT
and from NEW_TREE, and reports, per kernel of the old tree, whether the new tree has it with an
identical body (names, branch labels, .loc line info, comments and virtual register numbers
normalized; a template parameter appended with a default, e.g. ``..., false>``, maps back to the
old name). Used to show
that a commit after a GPU run left the GPU-tested kernels unchanged (docs/perf-notes.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import cutlass_library

UNITS = ("forward", "backward")
TAIL_FULL = "EEEvNS0_10GemmParamsE"  # end of a mangled wgmma_gemm_kernel<...> name


def ptx(tree: str, unit: str, out: str) -> None:
    cutlass = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
    jaxlib = os.path.join(os.path.dirname(__import__("jaxlib").__file__), "include")
    nanobind = os.path.join(os.path.dirname(__import__("nanobind").__file__), "include")
    subprocess.run(
        ["nvcc", "-DJAX_MOK_HAVE_CUTLASS=1", f"-I{tree}/ffi", f"-I{jaxlib}", f"-I{nanobind}",
         "-isystem", cutlass, "-O3", "-DNDEBUG", "-std=c++17", "-arch=sm_90a",
         "--expt-relaxed-constexpr", "-ptx", f"{tree}/ffi/cuda/{unit}.cu", "-o", out],
        check=True, stderr=subprocess.DEVNULL)


def bodies(path: str) -> dict[str, str]:
    text = open(path).read()
    out = {}
    for m in re.finditer(r"\.entry\s+(\S+)\(", text):
        start = text.index("\n{", m.start())
        body = text[m.end():text.index("\n}\n", start)]
        skip = (".loc", "//", ".file")
        lines = [ln for ln in body.splitlines() if not ln.strip().startswith(skip)]
        body = re.sub(r"_Z\w+", "FN", "\n".join(lines))
        out[m.group(1)] = _rename_registers(re.sub(r"\$L__tmp\d+", "$L__tmp", body))
    return out


def _rename_registers(body: str) -> str:
    """Virtual registers and branch labels renamed in order of first use (%r7 -> %r<0>, ...), so
    that two bodies compare equal exactly when they are the same instructions up to a consistent
    renaming: a refactor that only changes nvcc's numbering is not a change."""
    names: dict[str, str] = {}

    def canonical(m: re.Match) -> str:
        return names.setdefault(m.group(0), f"%{m.group(1)}<{len(names)}>")

    lines = [ln for ln in body.splitlines() if not ln.strip().startswith(".reg")]
    body = re.sub(r"%(rd|rs|r|fd|f|p|h|hh)\d+\b", canonical, "\n".join(lines))
    labels: dict[str, str] = {}  # branch labels likewise, in order of first mention
    return re.sub(
        r"\$L__BB\d+_\d+", lambda m: labels.setdefault(m.group(0), f"$L<{len(labels)}>"), body
    )


def old_name(name: str, old: set) -> str:
    """The old tree's name for a new kernel whose template lost or gained a last bool argument
    that is false in every default kernel: the name without that trailing ``false`` (a new
    argument), or with it (a removed one), when the old tree has a kernel of that name."""
    suffix = "ELb0" + TAIL_FULL
    if name in old or not name.endswith(TAIL_FULL):
        return name
    if name.endswith(suffix) and name[: -len(suffix)] + TAIL_FULL in old:
        return name[: -len(suffix)] + TAIL_FULL
    if name[: -len(TAIL_FULL)] + suffix in old:
        return name[: -len(TAIL_FULL)] + suffix
    return name


def main() -> int:
    commit, tree = sys.argv[1], os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else ".")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        worktree = os.path.join(tmp, "old")
        subprocess.run(["git", "-C", tree, "worktree", "add", "-f", "-q", worktree, commit],
                       check=True)
        try:
            for unit in UNITS:
                ptx(worktree, unit, os.path.join(tmp, f"old-{unit}.ptx"))
                ptx(tree, unit, os.path.join(tmp, f"new-{unit}.ptx"))
                old = bodies(os.path.join(tmp, f"old-{unit}.ptx"))
                new = {old_name(k, set(old)): v
                       for k, v in bodies(os.path.join(tmp, f"new-{unit}.ptx")).items()}
                same = [k for k in old if new.get(k) == old[k]]
                print(f"{unit}.cu: {len(same)} of {len(old)} kernels identical, "
                      f"{len(new) - len(same)} other kernels in the new tree")
                for k in old:
                    if new.get(k) != old[k]:
                        bad += 1
                        print(f"  {'changed' if k in new else 'missing'}: {k}")
        finally:
            subprocess.run(["git", "-C", tree, "worktree", "remove", "--force", worktree])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
