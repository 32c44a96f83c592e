"""Where a kernel's warps spend their time, from ncu's per-instruction source counters.

Input: the CSV of ``ncu --import REPORT.ncu-rep --page source --csv --print-source sass`` (the
report collected with ``--set full``, whose SourceCounters section samples warp stalls per SASS
instruction). One CSV holds every profiled kernel; ``--kernel N`` picks the N-th (0-based).

    python tools/ncu_sass.py top KERNEL.csv [--kernel 0] [--count 40]
        # the instructions with the most stall samples, each with its three largest reasons
    python tools/ncu_sass.py find KERNEL.csv PATTERN [PATTERN...]
        # instruction indices whose SASS contains a pattern (to choose region cuts)
    python tools/ncu_sass.py regions KERNEL.csv CUT[,CUT...] [--names a,b,...]
        # share of samples, instructions executed and the leading stall reasons per region
        # [0, cut1), [cut1, cut2), ... of the instruction list
    python tools/ncu_sass.py ops KERNEL.csv FIRST LAST --per N
        # executed instructions of [FIRST, LAST) by opcode, divided by N (e.g. warps x tiles)

Region cuts are instruction indices (``find`` prints them): a warp-specialized kernel's consumer
mainloop, its epilogue and its producer lie in contiguous address ranges.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re


def read_kernel(path: str, which: int) -> tuple[str, list[str], list[dict[str, str]]]:
    """(kernel name, column names, rows) of the ``which``-th kernel in the CSV."""
    name, header, rows, current = "", None, [], -1
    with open(path, newline="") as f:
        for rec in csv.reader(f):
            if rec and rec[0] == "Kernel Name":
                current += 1
                if current == which:
                    name = rec[1]
                continue
            if current != which:
                continue
            if header is None:
                header = rec
                continue
            rows.append(dict(zip(header, rec, strict=False)))
    if header is None:
        raise SystemExit(f"{path}: no kernel number {which}")
    return name, header, rows


def num(row: dict[str, str], key: str) -> float:
    value = row.get(key, "").replace(",", "")
    try:
        return float(value)
    except ValueError:
        return 0.0


def stall_columns(header: list[str]) -> list[str]:
    return [h for h in header if h.startswith("stall_") and "(Not" not in h]


def opcode(sass: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", sass.strip()).split()[0].split(".")[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("top", "find", "regions", "ops"))
    ap.add_argument("csv")
    ap.add_argument("args", nargs="*")
    ap.add_argument("--kernel", type=int, default=0)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--names", default="")
    ap.add_argument("--per", type=float, default=1.0)
    a = ap.parse_args(argv)
    name, header, rows = read_kernel(a.csv, a.kernel)
    stalls = stall_columns(header)
    total = sum(num(r, "# Samples") for r in rows) or 1.0
    print(f"{name[:160]}\n{len(rows)} instructions, {total:.0f} samples")
    if a.what == "top":
        order = sorted(range(len(rows)), key=lambda i: -num(rows[i], "# Samples"))[: a.count]
        for i in sorted(order):
            r = rows[i]
            reasons = sorted(((num(r, h), h[6:]) for h in stalls), reverse=True)[:3]
            executed = int(num(r, "Instructions Executed"))
            print(f"{i:5d} {100 * num(r, '# Samples') / total:5.1f}% "
                  f"exec {executed:>10d}  {r['Source'].strip()[:60]:60s} "
                  + " ".join(f"{h}:{int(v)}" for v, h in reasons if v > 0))
    elif a.what == "find":
        for i, r in enumerate(rows):
            if any(p in r["Source"] for p in a.args):
                print(f"{i:5d} exec {int(num(r, 'Instructions Executed')):>10d}  "
                      f"{r['Source'].strip()[:90]}")
    elif a.what == "regions":
        cuts = [int(c) for c in a.args[0].split(",")] if a.args else []
        bounds = [0, *cuts, len(rows)]
        names = a.names.split(",") if a.names else []
        for n, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
            seg = rows[lo:hi]
            share = sum(num(r, "# Samples") for r in seg) / total
            executed = sum(num(r, "Instructions Executed") for r in seg)
            reasons = sorted(((sum(num(r, h) for r in seg), h[6:]) for h in stalls),
                             reverse=True)[:6]
            label = names[n] if n < len(names) else f"[{lo},{hi})"
            print(f"{label:14s} {100 * share:5.1f}% inst {executed:.3g}  "
                  + " ".join(f"{h}:{100 * v / total:.1f}%" for v, h in reasons if v > 0))
    else:
        first, last = (int(v) for v in a.args[:2])
        counts: collections.Counter[str] = collections.Counter()
        for r in rows[first:last]:
            counts[opcode(r["Source"])] += num(r, "Instructions Executed")
        print(f"executed / {a.per:g}: {sum(counts.values()) / a.per:.1f}")
        for op, v in counts.most_common(a.count):
            print(f"  {op:12s} {v / a.per:10.1f}")


if __name__ == "__main__":
    main()
