"""results.json, results.md and results.png from the records of one run."""

from __future__ import annotations

import json
import math
import os

from benchmarks.problems import MEMORY_BOUND_SHAPES

PEERS = ("B1", "B2", "B3")
COLORS = {"jax_mok": "tab:blue", "B1": "tab:orange", "B2": "tab:green", "B3": "tab:red"}
STATUS_LABEL = {"OOM": "OOM", "check_failed": "check ✗", "error": "error", "crash": "crash",
                "timeout": "timeout", "skipped": "skipped", "unavailable": "n/a"}


def derive(records: list[dict], ceilings: dict | None) -> None:
    """Adds % of the matmul ceiling and, for memory-bound shapes, touched-weight bandwidth."""
    for r in records:
        if r.get("status") != "ok":
            continue
        if ceilings:
            r["pct_matmul_ceiling"] = 100 * r["tflops"] / ceilings["matmul_tflops"]
        if r["shape"] in MEMORY_BOUND_SHAPES and r["pass"] == "fwd" and "touched_weight_bytes" in r:
            r["touched_weight_gbps"] = r["touched_weight_bytes"] / (r["median_ms"] * 1e-3) / 1e9
            if ceilings:
                r["pct_hbm"] = 100 * r["touched_weight_gbps"] / ceilings["hbm_gbps"]


def speedups(records: list[dict]) -> list[dict]:
    """jax_mok's speed-up over each peer (peer time / jax_mok time), pair by pair."""
    by_key = {(r["shape"], r["routing"], r["pass"], r["impl"]): r for r in records}
    out = []
    for (shape, routing, passname, impl), r in by_key.items():
        if impl != "jax_mok" or r.get("status") != "ok":
            continue
        for peer in PEERS:
            p = by_key.get((shape, routing, passname, peer))
            if p is not None and p.get("status") == "ok":
                out.append({"shape": shape, "routing": routing, "pass": passname, "peer": peer,
                            "speedup": p["median_ms"] / r["median_ms"]})
    return out


def _cell(r: dict | None) -> str:
    if r is None:
        return "–"
    if r.get("status") != "ok":
        return STATUS_LABEL.get(r.get("status"), r.get("status", "?"))
    if r["shape"] in MEMORY_BOUND_SHAPES:
        text = f"{r['median_ms']:.3g} ms"
        if "pct_hbm" in r:
            text += f" ({r['pct_hbm']:.0f} % HBM)"
        return text
    text = f"{r['tflops']:.4g}"
    if "pct_matmul_ceiling" in r:
        text += f" ({r['pct_matmul_ceiling']:.0f} %)"
    return text


def _rows(records: list[dict]) -> list[tuple]:
    seen = []
    for r in records:
        row = (r["shape"], r["routing"], r["pass"])
        if row not in seen:
            seen.append(row)
    return seen


def markdown(result: dict) -> str:
    records = result["records"]
    impls = [i for i in ("jax_mok", "B1", "B2", "B3") if any(r["impl"] == i for r in records)]
    peers = [i for i in impls if i != "jax_mok"]
    meta, ceil = result["meta"], result.get("ceilings") or {}
    machine = meta.get("machine", {})
    lines = [
        f"# jax_mok benchmark ({meta.get('date', '')})",
        "",
        f"- command: `{meta.get('command', '')}`",
        f"- commit: {meta.get('git_commit', '?')}"
        + (" (uncommitted changes in the tree)" if meta.get("git_dirty") else ""),
        f"- machine: {machine.get('gpu_name') or machine.get('device_kind', '?')} "
        f"({machine.get('platform', '?')}); jax {machine.get('jax')}, jaxlib "
        f"{machine.get('jaxlib')}, torch {machine.get('torch')}",
    ]
    if ceil:
        lines.append(f"- measured ceilings: bf16 matmul {ceil['matmul_tflops']:.1f} TFLOP/s, "
                     f"copy {ceil['hbm_gbps']:.0f} GB/s (read + write)")
    if not meta.get("protocol", True):
        lines.append("- **not the protocol** (--quick / scaled shapes): numbers are for "
                     "smoke-testing only")
    lines += [
        "",
        "TFLOP/s over routed FLOPs (forward 6·T·k·H·F, forward+backward 3×), in parentheses % of "
        "the measured matmul ceiling; memory-bound shapes in ms and % of copy bandwidth over the "
        "expert weights touched. Speed-up = peer time / jax_mok time.",
        "",
    ]
    head = ["shape", "routing", "pass", *impls, *[f"vs {p}" for p in peers]]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    by_key = {(r["shape"], r["routing"], r["pass"], r["impl"]): r for r in records}
    ups = {(s["shape"], s["routing"], s["pass"], s["peer"]): s["speedup"]
           for s in result.get("speedups", [])}
    for shape, routing, passname in _rows(records):
        cells = [shape, routing, passname]
        cells += [_cell(by_key.get((shape, routing, passname, i))) for i in impls]
        for p in peers:
            up = ups.get((shape, routing, passname, p))
            cells.append(f"{up:.2f}×" if up is not None else "–")
        lines.append("| " + " | ".join(cells) + " |")
    problems = [r for r in records if r.get("status") not in ("ok", "unavailable", "skipped")]
    if problems:
        lines += ["", "Not timed:"]
        for r in problems:
            lines.append(f"- {r['key']}: {r['status']} — {r.get('reason', '')[:300]}")
    unavailable = {r.get("reason") for r in records if r.get("status") == "unavailable"}
    for reason in sorted(x for x in unavailable if x):
        lines.append(f"- n/a: {reason}")
    skipped = [r["key"] for r in records if r.get("status") == "skipped"]
    if skipped:
        lines.append(f"- skipped ({len(skipped)} items): {', '.join(skipped[:20])}"
                     f"{' …' if len(skipped) > 20 else ''}")
    return "\n".join(lines) + "\n"


def chart(result: dict, path: str) -> None:
    """Grouped bars: TFLOP/s per implementation, one panel per pass."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = result["records"]
    impls = [i for i in ("jax_mok", "B1", "B2", "B3") if any(r["impl"] == i for r in records)]
    passes = [p for p in ("fwd", "fwdbwd") if any(r["pass"] == p for r in records)] or ["fwd"]
    fig, axes = plt.subplots(len(passes), 1, figsize=(13, 4 * len(passes)), squeeze=False)
    by_key = {(r["shape"], r["routing"], r["pass"], r["impl"]): r for r in records}
    groups = []
    for r in records:
        if (r["shape"], r["routing"]) not in groups:
            groups.append((r["shape"], r["routing"]))
    width = 0.8 / max(1, len(impls))
    ceiling = (result.get("ceilings") or {}).get("matmul_tflops")
    for ax, passname in zip(axes[:, 0], passes, strict=False):
        for j, impl in enumerate(impls):
            xs, heights = [], []
            for g, (shape, routing) in enumerate(groups):
                r = by_key.get((shape, routing, passname, impl))
                x = g - 0.4 + width * (j + 0.5)
                if r is not None and r.get("status") == "ok":
                    xs.append(x)
                    heights.append(r["tflops"])
                elif r is not None:
                    ax.text(x, 0, STATUS_LABEL.get(r.get("status"), "?"), rotation=90,
                            ha="center", va="bottom", fontsize=7)
            # an empty bar list would give the legend a default colour: draw a zero-height bar
            ax.bar(xs or [0.0], heights or [0.0], width, label=impl, color=COLORS.get(impl))
        if ceiling and not math.isnan(ceiling):
            ax.axhline(ceiling, color="gray", linestyle="--", linewidth=0.8,
                       label=f"bf16 matmul ceiling {ceiling:.3g}")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{s}\n{r}" for s, r in groups])
        ax.set_ylim(bottom=0)
        ax.set_xlim(-0.5, len(groups) - 0.5)
        ax.set_ylabel("TFLOP/s (routed)")
        ax.set_title(f"{passname}")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    machine = result["meta"].get("machine", {})
    fig.suptitle(f"jax_mok vs peers — {machine.get('gpu_name') or machine.get('device_kind', '')}"
                 f" — {(result['meta'].get('git_commit') or 'commit ?')[:10]}")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write(out_dir: str, result: dict) -> dict:
    """Writes results.json / results.md / results.png into ``out_dir``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    derive(result["records"], result.get("ceilings"))
    result["speedups"] = speedups(result["records"])
    paths = {name: os.path.join(out_dir, f"results.{name}") for name in ("json", "md", "png")}
    with open(paths["json"], "w") as f:
        json.dump(result, f, indent=1)
    with open(paths["md"], "w") as f:
        f.write(markdown(result))
    try:
        chart(result, paths["png"])
    except Exception as error:  # noqa: BLE001 - a missing matplotlib must not lose the numbers
        print(f"chart not written: {type(error).__name__}: {error}", flush=True)
        paths.pop("png")
    return paths
