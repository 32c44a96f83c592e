"""Are the device kernels of two trees the same code? Compares the PTX of every kernel entry.

    python3 tools/ptx_compare.py OLD_COMMIT [NEW_TREE=.] [--jobs N]   # needs nvcc + CUTLASS headers

Builds the PTX (sm_90a) of every ``.cu`` file under ``ffi/cuda/`` of a worktree of OLD_COMMIT and
of NEW_TREE, found recursively in each, so files may move between the two. Kernels are matched by
their demangled names, whatever file holds them, and reported per kernel of the old tree:
identical (same body after normalizing names, branch labels, ``.loc`` line info, comments and
virtual register numbers), changed, or missing. A kernel whose template lost a parameter together
with a deleted switch is matched through RENAMES. Exit status 1 when any old kernel is changed or
missing (a deletion is then expected to be explained; docs/perf-notes.md keeps the record).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

import cutlass_library

# Old demangled name -> new demangled name, for template parameters deleted with their switch.
# Each rule is tried in turn (cumulatively) on an old name the new tree does not have.
RENAMES: list[tuple[str, str]] = [
    # kTma (JAX_MOK_CUDA_TMA): the wgmma kernels always load the weight operand by TMA.
    (r"wgmma_gemm_kernel<(\(mok::cuda::Mode\)\d), (\(mok::cuda::Epi\)\d), true, ",
     r"wgmma_gemm_kernel<\1, \2, "),
    # kUnroll (JAX_MOK_PEER_UNROLL): the exchange kernel copies one vector per step.
    (r"exchange_kernel<([^<>]+), (\d), 1>", r"exchange_kernel<\1, \2>"),
]


def include_flags() -> list[str]:
    cutlass = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
    jaxlib = os.path.join(os.path.dirname(__import__("jaxlib").__file__), "include")
    return ["-DJAX_MOK_HAVE_CUTLASS=1", f"-I{jaxlib}", "-isystem", cutlass]


def units(tree: str) -> list[str]:
    root = os.path.join(tree, "ffi", "cuda")
    found = []
    for folder, _, files in os.walk(root):
        found += [os.path.join(folder, f) for f in files if f.endswith(".cu")]
    return sorted(found)


def ptx(tree: str, unit: str, out: str) -> str:
    subprocess.run(
        ["nvcc", *include_flags(), f"-I{tree}/ffi", "-O3", "-DNDEBUG", "-std=c++17",
         "-arch=sm_90a", "--expt-relaxed-constexpr", "-ptx", unit, "-o", out],
        check=True, stderr=subprocess.DEVNULL)
    return out


def demangle(names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return dict(zip(names, out, strict=True))


def bodies(path: str) -> dict[str, str]:
    """Mangled kernel name -> normalized body, followed by the bodies of the device functions it
    calls (transitively, each once, in order of first call): a change inside a function that
    nvcc did not inline is a change of every kernel that calls it."""
    text = open(path).read()
    funcs = {}
    for m in re.finditer(r"^(?:\.visible |\.weak )?\.func\s+(?:\([^)]*\)\s*)?(\w+)\(", text,
                         re.MULTILINE):
        brace, semicolon = text.find("\n{", m.end()), text.find(";\n", m.end())
        if brace != -1 and (semicolon == -1 or brace < semicolon):  # a definition, not a prototype
            funcs[m.group(1)] = text[m.end():_body_end(text, brace + 1)]
    out = {}
    for m in re.finditer(r"\.entry\s+(\S+)\(", text):
        body = text[m.end():_body_end(text, text.index("\n{", m.start()) + 1)]
        seen: list[str] = []
        pending = [body]
        while pending:
            for callee in re.findall(r"\bcall(?:\.uni)?\s+(?:\([^)]*\),\s*)?(\w+)", pending.pop()):
                if callee in funcs and callee not in seen:
                    seen.append(callee)
                    pending.append(funcs[callee])
        body = "\n".join([body] + [funcs[f] for f in seen])
        skip = (".loc", "//", ".file")
        lines = [ln for ln in body.splitlines() if not ln.strip().startswith(skip)]
        body = re.sub(r"_Z\w+", "FN", "\n".join(lines))
        out[m.group(1)] = _rename_registers(re.sub(r"\$L__tmp\d+", "$L__tmp", body))
    return out


def _body_end(text: str, open_brace: int) -> int:
    """Index just past the brace that closes the one at `open_brace`. Inline asm blocks and vector
    operands nest balanced braces inside a body (an asm block's closing brace may stand alone on
    a line), so only counting finds the body's end."""
    depth = 0
    for i in range(open_brace, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError("unbalanced braces in PTX")


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


def kernels(tree: str, tag: str, tmp: str, jobs: int) -> dict[str, set[str]]:
    """Demangled kernel name -> the set of its normalized bodies over every unit of `tree` (a
    header kernel compiled into two units has one body in each: normally the same)."""
    files = units(tree)
    outs = [os.path.join(tmp, f"{tag}-{i}.ptx") for i in range(len(files))]
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda a: ptx(tree, *a), zip(files, outs, strict=True)))
    found: dict[str, set[str]] = {}
    for path in outs:
        per_unit = bodies(path)
        plain = demangle(list(per_unit))
        for mangled, body in per_unit.items():
            found.setdefault(plain[mangled], set()).add(body)
    return found


def new_name(old: str, new: dict[str, set[str]]) -> str:
    name = old
    for pattern, replacement in RENAMES:
        if name in new:
            return name
        name = re.sub(pattern, replacement, name)
    return name if name in new else old


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit")
    parser.add_argument("tree", nargs="?", default=".")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    tree = os.path.abspath(args.tree)
    with tempfile.TemporaryDirectory() as tmp:
        worktree = os.path.join(tmp, "old")
        subprocess.run(["git", "-C", tree, "worktree", "add", "-f", "-q", worktree, args.commit],
                       check=True)
        try:
            old = kernels(worktree, "old", tmp, args.jobs)
            new = kernels(tree, "new", tmp, args.jobs)
        finally:
            subprocess.run(["git", "-C", tree, "worktree", "remove", "--force", worktree])
    matched = {k: new_name(k, new) for k in old}
    same = [k for k in old if new.get(matched[k]) == old[k]]
    print(f"{len(same)} of {len(old)} kernels of {args.commit} identical in {args.tree}")
    bad = 0
    for k in sorted(old):
        if new.get(matched[k]) == old[k]:
            continue
        bad += 1
        state = "changed" if matched[k] in new else "missing"
        renamed = f" (as {matched[k]})" if matched[k] != k else ""
        print(f"  {state}: {k}{renamed}")
    others = sorted(set(new) - set(matched.values()))
    print(f"{len(others)} other kernels in the new tree")
    for k in others:
        print(f"  new: {k}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
