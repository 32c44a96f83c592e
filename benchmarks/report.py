"""results.json, results.md and results.png from the records of one run."""

from __future__ import annotations

import json
import math
import os

from benchmarks import roofline
from benchmarks.impls import FP8_ACCURACY_TARGET, IMPLS, RUN_ORDER

COLORS = {"jax_mok": "tab:blue", "jax_mok-fp8_block": "navy", "jax_mok-mxfp8": "royalblue",
          "jax_mok-fp8_block-prep": "slateblue", "jax_mok-mxfp8-prep": "mediumpurple",
          "jax_mok-fp8_block-pq": "darkcyan", "jax_mok-mxfp8-pq": "cadetblue",
          "B1": "tab:orange", "B2": "tab:green", "B3": "tab:red", "B3-fp8": "darkred",
          "B6": "tab:purple"}
STATUS_LABEL = {"OOM": "OOM", "check_failed": "check ✗", "error": "error", "crash": "crash",
                "timeout": "timeout", "skipped": "skipped", "unavailable": "n/a",
                "unsupported": "unsupported"}
_GRAD_NAMES = ("dx", "d_topk_weights", "d_w_gate_up", "d_w_down")


def derive(records: list[dict], ceilings: dict | None) -> None:
    """Adds % of the matmul ceiling of the row's precision, the roofline (``roofline.py``) and
    % of it, and the touched-weight bandwidth (bytes of the weights read / time)."""
    ceilings = ceilings or {}
    for r in records:
        if r.get("status") != "ok":
            continue
        ceiling = roofline.ceiling_tflops(r, ceilings)
        if ceiling:
            r["pct_matmul_ceiling"] = 100 * r["tflops"] / ceiling
        if "experts_touched" in r:
            touched = r["experts_touched"] * r["weight_bytes_per_expert"]
            r["touched_weight_gbps"] = touched / (r["median_ms"] * 1e-3) / 1e9
            line = roofline.roofline(r, ceilings)
            if line is not None:
                r.update(line)
                r["pct_roofline"] = 100 * line["roofline_ms"] / r["median_ms"]


def _ok(r: dict | None) -> bool:
    return r is not None and r.get("status") == "ok"


def speedups(records: list[dict]) -> list[dict]:
    """Every jax_mok row's speed-up over every timed peer of the same (shape, routing, pass)
    and precision: peer time / our time, pair by pair."""
    by_key = {(r["shape"], r["routing"], r["pass"], r["impl"]): r for r in records}
    out = []
    for (shape, routing, passname, impl), r in by_key.items():
        if IMPLS[impl].peer or not _ok(r):
            continue
        for peer in (n for n in RUN_ORDER if IMPLS[n].peer):
            p = by_key.get((shape, routing, passname, peer))
            if _ok(p) and IMPLS[peer].precision == IMPLS[impl].precision:
                out.append({"shape": shape, "routing": routing, "pass": passname, "impl": impl,
                            "peer": peer, "speedup": p["median_ms"] / r["median_ms"]})
    return out


def best_peer(records: list[dict], r: dict) -> dict | None:
    """The fastest timed peer of ``r``'s (shape, routing, pass) with ``r``'s precision."""
    peers = [p for p in records if IMPLS[p["impl"]].peer and _ok(p)
             and p.get("precision") == r.get("precision")
             and (p["shape"], p["routing"], p["pass"]) == (r["shape"], r["routing"], r["pass"])]
    return min(peers, key=lambda p: p["median_ms"], default=None)


def _versus(records: list[dict], r: dict) -> str:
    """The speed-up cell: over the best peer of the same precision; FP8 rows also over our
    bf16 row."""
    if IMPLS[r["impl"]].peer or not _ok(r):
        return "–"
    parts = []
    peer = best_peer(records, r)
    if peer is not None:
        parts.append(f"{peer['median_ms'] / r['median_ms']:.2f}× {peer['impl']}")
    if r.get("precision") == "fp8":
        ours = next((o for o in records if o["impl"] == "jax_mok" and _ok(o) and
                     (o["shape"], o["routing"], o["pass"]) == (r["shape"], r["routing"],
                                                               r["pass"])), None)
        if ours is not None:
            parts.append(f"{ours['median_ms'] / r['median_ms']:.2f}× bf16")
    return "; ".join(parts) or "–"


def _accuracy(r: dict) -> str:
    """Relative Frobenius errors against the float32 reference: y, and the worst gradient."""
    check = r.get("check")
    if not check:
        return "–"
    errors = check["errors"]
    text = f"y {errors['y']:.1e}"
    grads = [errors[n] for n in _GRAD_NAMES if n in errors]
    if grads:
        text += f", ∇ ≤ {max(grads):.1e}"
    if r.get("precision") == "fp8" and check["max_error"] > FP8_ACCURACY_TARGET:
        text += " †"
    return text + ("" if check["passed"] else " ✗")


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _header(result: dict) -> list[str]:
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
        f"{machine.get('jaxlib')}, torch {machine.get('torch')}, liger-kernel "
        f"{machine.get('liger_kernel')}",
    ]
    if ceil:
        fp8 = ceil.get("fp8_matmul_tflops")
        lines.append(f"- measured ceilings: bf16 matmul {_fmt(ceil.get('matmul_tflops'), '.1f')} "
                     f"TFLOP/s, FP8 matmul {_fmt(fp8, '.1f')} TFLOP/s, copy "
                     f"{_fmt(ceil.get('hbm_gbps'), '.0f')} GB/s (read + write)")
    if not meta.get("protocol", True):
        lines.append("- **not the protocol** (--quick / scaled shapes): numbers are for "
                     "smoke-testing only")
    return lines


def markdown(result: dict) -> str:
    records = result["records"]
    lines = _header(result) + [
        "",
        "TFLOP/s over routed FLOPs (forward 6·T·k·H·F, forward+backward 3×); % ceiling: of the "
        "measured matmul ceiling of the row's precision (bf16 or FP8); % roofline: roofline "
        "time / time, roofline = max(FLOPs / that ceiling, bytes that must move / copy "
        "bandwidth) (benchmarks/roofline.py); speed-up: time of the fastest peer of the same "
        "precision / this time, and for FP8 rows our bf16 time / this time; accuracy: relative "
        "Frobenius error against the float32 reference on the probe (y, worst gradient).",
        "",
        "| shape | routing | pass | impl | ms | TFLOP/s | % ceiling | % roofline | speed-up | "
        "accuracy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        cells = [r["shape"], r["routing"], r["pass"], r["impl"]]
        if _ok(r):
            bound = {"compute": "c", "memory": "m"}.get(r.get("roofline_bound"), "")
            cells += [f"{r['median_ms']:.3f}", f"{r['tflops']:.4g}",
                      _fmt(r.get("pct_matmul_ceiling"), ".0f", " %"),
                      _fmt(r.get("pct_roofline"), ".0f", f" % {bound}".rstrip()),
                      _versus(records, r), _accuracy(r)]
        else:
            label = STATUS_LABEL.get(r.get("status"), r.get("status", "?"))
            if r.get("not_retried"):  # out of memory beside other items only (run.py)
                label += " (not alone)"
            cells += [label, "–", "–", "–", "–", _accuracy(r)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "c / m after % roofline: the compute or the memory term is the larger. "
              f"†: an FP8 row above issue 13's {FP8_ACCURACY_TARGET:g} accuracy target (E4M3 "
              "operands give ~6-7 % on random normal inputs; benchmarks/impls.py). ✗: above "
              "the check bound, not timed."]
    lines += _pairwise(result)
    lines += _memory(records)
    lines += _not_timed(records)
    return "\n".join(lines) + "\n"


def _pairwise(result: dict) -> list[str]:
    """jax_mok's speed-up over each peer, pair by pair, one row per (shape, routing, pass)."""
    ups = result.get("speedups", [])
    if not ups:
        return []
    peers = [p for p in RUN_ORDER if any(s["peer"] == p for s in ups)]
    ours = [i for i in RUN_ORDER if any(s["impl"] == i for s in ups)]
    cols = [(i, p) for i in ours for p in peers
            if any(s["impl"] == i and s["peer"] == p for s in ups)]
    table = {(s["shape"], s["routing"], s["pass"], s["impl"], s["peer"]): s["speedup"]
             for s in ups}
    head = ["shape", "routing", "pass"] + [
        (f"vs {p}" if i == "jax_mok" else f"{i} vs {p}") for i, p in cols]
    lines = ["", "Speed-ups pair by pair, same precision (peer time / our time):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    for s in ups:
        if (s["shape"], s["routing"], s["pass"]) not in rows:
            rows.append((s["shape"], s["routing"], s["pass"]))
    for row in rows:
        cells = [*row] + [_fmt(table.get((*row, i, p)), ".2f", "×") for i, p in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _memory(records: list[dict]) -> list[str]:
    """The JAX rows' device memory: each timed program's arguments (the arrays it is called
    with) and XLA's buffer assignment of its outputs and temporaries."""
    rows = [r for r in records if r.get("program_bytes")]
    if not rows:
        return []
    gib = 1 << 30
    lines = ["", "Device memory of each timed JAX program (GiB; arguments: the arrays it is "
             "called with; outputs and temporaries: XLA's buffer assignment; peak = arguments + "
             "outputs + temporaries, aliased outputs once):", "",
             "| shape | pass | impl | arguments | outputs | temporaries | peak |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["program_bytes"]
        lines.append(f"| {r['shape']} | {r['pass']} | {r['impl']} | {b['arguments'] / gib:.2f} | "
                     f"{b['outputs'] / gib:.2f} | {b['temporaries'] / gib:.2f} | "
                     f"{b['peak'] / gib:.2f} |")
    return lines


def _not_timed(records: list[dict]) -> list[str]:
    lines = []
    problems = [r for r in records if r.get("status") not in ("ok", "unavailable", "skipped")]
    if problems:
        lines += ["", "Not timed:"]
        for r in problems:
            lines.append(f"- {r['key']}: {r['status']} — {r.get('reason', '')[:300]}")
    unavailable = {f"{r['impl']}: {r.get('reason')}" for r in records
                   if r.get("status") == "unavailable"}
    for reason in sorted(unavailable):
        lines.append(f"- n/a: {reason}")
    fresh = [r["key"] for r in records if r.get("retried_fresh") and r.get("status") == "ok"]
    if fresh:
        lines += ["", "Timed alone in a fresh worker after running out of memory beside the "
                      f"shape's other items (run.py, `_retry_oom_fresh`): {', '.join(fresh)}"]
    skipped = [r["key"] for r in records if r.get("status") == "skipped"]
    if skipped:
        lines.append(f"- skipped ({len(skipped)} items): {', '.join(skipped[:20])}"
                     f"{' …' if len(skipped) > 20 else ''}")
    return lines


def chart(result: dict, path: str) -> None:
    """Grouped bars: TFLOP/s per implementation, one panel per pass, the ceilings as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = result["records"]
    impls = [i for i in RUN_ORDER if any(r["impl"] == i for r in records)]
    passes = [p for p in ("fwd", "fwdbwd") if any(r["pass"] == p for r in records)] or ["fwd"]
    fig, axes = plt.subplots(len(passes), 1, figsize=(14, 4.5 * len(passes)), squeeze=False)
    by_key = {(r["shape"], r["routing"], r["pass"], r["impl"]): r for r in records}
    groups = []
    for r in records:
        if (r["shape"], r["routing"]) not in groups:
            groups.append((r["shape"], r["routing"]))
    width = 0.8 / max(1, len(impls))
    ceil = result.get("ceilings") or {}
    for ax, passname in zip(axes[:, 0], passes, strict=False):
        for j, impl in enumerate(impls):
            xs, heights = [], []
            for g, (shape, routing) in enumerate(groups):
                r = by_key.get((shape, routing, passname, impl))
                x = g - 0.4 + width * (j + 0.5)
                if _ok(r):
                    xs.append(x)
                    heights.append(r["tflops"])
                elif r is not None:
                    ax.text(x, 0, STATUS_LABEL.get(r.get("status"), "?"), rotation=90,
                            ha="center", va="bottom", fontsize=6)
            # an empty bar list would give the legend a default colour: draw a zero-height bar
            ax.bar(xs or [0.0], heights or [0.0], width, label=impl, color=COLORS.get(impl))
        for key, style, name in (("matmul_tflops", "--", "bf16"),
                                 ("fp8_matmul_tflops", ":", "FP8")):
            value = ceil.get(key)
            if value and not math.isnan(value):
                ax.axhline(value, color="gray", linestyle=style, linewidth=0.8,
                           label=f"{name} matmul ceiling {value:.3g}")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{s}\n{r}" for s, r in groups])
        ax.set_ylim(bottom=0)
        ax.set_xlim(-0.5, len(groups) - 0.5)
        ax.set_ylabel("TFLOP/s (routed)")
        ax.set_title(f"{passname}")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
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
