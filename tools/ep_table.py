"""Markdown table of the expert-parallel timings: tools/ep_bench.py records (B4 = transport "xla",
and "peer") next to B5's (benchmarks.ep_torch), matched by (shape, tokens per GPU, routing, EP).

    python3 tools/ep_table.py OUT/ep.jsonl [MORE.jsonl ...] [OUT/ep_torch.jsonl]

Each line of each file is classified by its content: JSON with ``"impl": "B5"`` is B5, other JSON
is ep_bench. A saved stdout of ep_torch works too: its progress lines (``[ 12.4s] S1 T=8192
balanced ep=2: fwd 7.733 ms``) give B5's times, and its JSON lines cut short (``..., ...}``) are
read up to the cut, their missing config fields taken from the progress line before them.

Times in ms. Ratios are B5 (or B4) ms / peer ms: above 1, peer is faster. The exchange columns
are one dispatch exchange alone with GB/s per direction. ``overlap`` = peer fwd / max(compute-only
fwd, 2 x peer exchange), from the record or computed the same way for old records. Records
without ``inner`` (before in-program timing) hold per-call wall times, host dispatch included:
the note column says "per call". Missing values print as "–".
"""

from __future__ import annotations

import argparse
import json
import re

PROGRESS = re.compile(r"\]\s+(\S+) T=(\d+) (\w+) ep=(\d+): (.*)")
PROGRESS_FIELDS = {
    "fwd_ms": r"^fwd ([\d.]+) ms",
    "fwd_bwd_ms": r"^fwd\+bwd ([\d.]+) ms",
}
CONFIG = ("shape", "tokens_per_gpu", "routing", "ep")
DASH = "–"


def _key(rec: dict) -> tuple:
    return tuple(rec.get(k) for k in CONFIG)


def _json(line: str) -> dict | None:
    for text in (line, re.sub(r",\s*\.\.\.\s*}$", "}", line)):  # as is, then cut short
        try:
            rec = json.loads(text)
        except json.JSONDecodeError:
            continue
        return rec if isinstance(rec, dict) else None
    return None


def load(paths: list[str]) -> tuple[list[dict], dict[tuple, dict]]:
    """(ep_bench records in file order, B5 records by config key)."""
    ep, b5 = [], {}
    for path in paths:
        last: dict = {}  # the config of the latest B5 progress line
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                m = PROGRESS.search(line)
                if m:
                    last = dict(zip(CONFIG, (m[1], int(m[2]), m[3], int(m[4])), strict=True))
                    rec = b5.setdefault(_key(last), {"impl": "B5", **last})
                    for field, pattern in PROGRESS_FIELDS.items():
                        if found := re.search(pattern, m[5]):
                            rec[field] = float(found[1])
                    continue
                rec = _json(line) if line.startswith("{") else None
                if rec is None:
                    continue
                if rec.get("impl") != "B5":
                    ep.append(rec)
                    continue
                if all(rec.get(k, v) == v for k, v in last.items()):  # fill a cut record
                    rec = {**last, **rec}
                b5.setdefault(_key(rec), {}).update(rec)
    return ep, b5


def _num(rec: dict | None, name: str) -> float | None:
    v = (rec or {}).get(name)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _ms(v: float | None) -> str:
    return DASH if v is None else f"{v:.3f}"


def _ratio(a: float | None, b: float | None) -> str:
    return DASH if a is None or not b else f"{a / b:.2f}"


def _exchange(ex: dict, transport: str) -> tuple[float | None, str]:
    """(ms, "ms (GB/s)") of one exchange; old records name the ms ``peer`` / ``xla``."""
    ms = _num(ex, f"{transport}_ms")
    ms = _num(ex, transport) if ms is None else ms
    rate = _num(ex, f"{transport}_GBps")
    return ms, DASH if ms is None else _ms(ms) + ("" if rate is None else f" ({rate:.3g})")


def _note(rec: dict | None, b5: dict | None) -> str:
    notes = []
    if rec:
        if "skipped" in rec:
            notes.append("B4/peer skipped")
        notes += [k for k in rec if k.endswith("error")]
        if "inner" in rec:
            notes.append(f"in-program x{rec['inner']}")
        if rec.get("peer_check") == "deferred":
            notes.append("peer check deferred")
        elif any(k.endswith("_ms") for k in rec):
            notes.append("per call")
        notes += [f"{k}={v}" for k, v in (rec.get("switches") or {}).items()]
        if rec.get("router_precision", "highest") != "highest":
            notes.append(f"router {rec['router_precision']}")
    for k in ("skipped", "error"):
        if b5 and k in b5:
            notes.append(f"B5 {k}")
    if b5 and b5.get("check_passed") is False:
        notes.append("B5 check failed")
    return ", ".join(notes)


HEADER = (
    "shape",
    "tokens/GPU",
    "EP",
    "routing",
    "hot share (ours / B5)",
    "B5 fwd",
    "B5 fwd+bwd",
    "B4 fwd",
    "B4 fwd+bwd",
    "peer fwd",
    "peer fwd+bwd",
    "compute-only fwd",
    "compute-only fwd+bwd",
    "exchange peer ms (GB/s)",
    "xla a2a ms (GB/s)",
    "B5/peer fwd",
    "B5/peer fwd+bwd",
    "B4/peer fwd",
    "B4/peer fwd+bwd",
    "overlap",
    "note",
)


def row(rec: dict | None, b5: dict | None) -> list[str]:
    config = rec or b5 or {}
    peer_ex, peer_cell = _exchange((rec or {}).get("exchange") or {}, "peer")
    _, xla_cell = _exchange((rec or {}).get("exchange") or {}, "xla")
    t = {name: _num(rec, name) for name in (rec or {})}
    peer_fwd, peer_fb = t.get("peer_fwd_ms"), t.get("peer_fwd_bwd_ms")
    b4_fwd, b4_fb = t.get("xla_fwd_ms"), t.get("xla_fwd_bwd_ms")
    b5_fwd, b5_fb = _num(b5, "fwd_ms"), _num(b5, "fwd_bwd_ms")
    overlap, compute = t.get("overlap"), t.get("compute_only_fwd_ms")
    if overlap is None and peer_fwd and compute and peer_ex:
        overlap = peer_fwd / max(compute, 2 * peer_ex)
    hot = [_num(r, "hot_share") for r in (rec, b5)]
    return [
        str(config.get("shape", DASH)),
        str(config.get("tokens_per_gpu", DASH)),
        str(config.get("ep", DASH)),
        str(config.get("routing", DASH)),
        " / ".join(DASH if h is None else f"{h:.2f}" for h in hot),
        _ms(b5_fwd),
        _ms(b5_fb),
        _ms(b4_fwd),
        _ms(b4_fb),
        _ms(peer_fwd),
        _ms(peer_fb),
        _ms(compute),
        _ms(t.get("compute_only_fwd_bwd_ms")),
        peer_cell,
        xla_cell,
        _ratio(b5_fwd, peer_fwd),
        _ratio(b5_fb, peer_fb),
        _ratio(b4_fwd, peer_fwd),
        _ratio(b4_fb, peer_fb),
        DASH if overlap is None else f"{overlap:.2f}",
        _note(rec, b5) or DASH,
    ]


def table(ep: list[dict], b5: dict[tuple, dict]) -> str:
    rows = [row(rec, b5.get(_key(rec))) for rec in ep]
    matched = {_key(rec) for rec in ep}
    rows += [row(None, rec) for key, rec in b5.items() if key not in matched]
    lines = [HEADER, ("---",) * len(HEADER), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="ep_bench jsonl files and/or B5 jsonl / stdout")
    args = ap.parse_args()
    print(table(*load(args.files)))


if __name__ == "__main__":
    main()
