"""The end-to-end benchmark's outputs: JSON, a markdown table and a PNG chart."""

from __future__ import annotations

import json
import pathlib


def write_json(result: dict, out: pathlib.Path) -> pathlib.Path:
    path = out / "e2e.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    return path


def _row(name: str, run: dict, baseline: dict | None) -> str:
    if run.get("status") != "ok":
        return f"| {name} | {_batch(run)} | - | - | - | - | - | - | " \
               f"{run.get('status')}: {run.get('error', '')[:120]} |"
    # FP8 rows: their tokens/s over jax_mok's (BF16); BF16 alternatives: jax_mok's speed-up.
    ratio = speedup = ""
    if run.get("own_best"):  # against jax_mok's own-best row, FP8 only (batches differ)
        baseline = None
        if run.get("tokens_per_s_vs_jax_mok"):
            ratio = f"{run['tokens_per_s_vs_jax_mok']:.2f}x"
    if baseline and baseline.get("status") == "ok" and name != "jax_mok":
        if run.get("quantization"):
            ratio = f"{run['tokens_per_s'] / baseline['tokens_per_s']:.2f}x"
        else:
            speedup = f"{baseline['tokens_per_s'] / run['tokens_per_s']:.2f}x"
    loss = f"{run['losses'][-1]:.4f}" if run.get("losses") else ""
    notes = []
    if run.get("fp8_path"):
        notes.append(f"FP8 {run['fp8_path']}")
    if run.get("capacity"):
        notes.append(f"capacity {run['capacity']}, dropped {100 * run['dropped_fraction']:.2f} %")
    if run.get("own_best"):
        tried = ", ".join(f"{a['batch']}: {a['status']}" for a in run.get("batch_attempts", []))
        notes.append(f"OWN BEST BATCH (shared batch {run['shared_batch']}; tried {tried}; "
                     f"stopped: {run.get('own_best_stop', '')})")
    elif run.get("oom_batches"):
        notes.append(f"out of memory at batch {run['oom_batches']}")
    if run.get("breakdown", {}).get("moe_ms") is not None:
        b = run["breakdown"]
        notes.append(f"MoE {b['moe_ms']:.1f} ms / rest {b['rest_ms']:.1f} ms ({b['method']})")
    return (f"| {name} | {_batch(run)} | {run['step_ms_median']:.1f} | "
            f"{run['tokens_per_s']:,.0f} | {100 * run['mfu']:.1f} % | {ratio} | {speedup} | "
            f"{loss} | {'; '.join(notes)} |")


def _batch(run: dict) -> str:
    """Sequences per device per micro-batch, and the micro-batches of a step where several."""
    micro = run.get("micro_batches", 1)
    batch = run.get("batch", "")
    return f"{batch} × {micro} micro-batches" if micro > 1 else f"{batch}"


def markdown(result: dict) -> str:
    m, c = result["machine"], result["config"]
    runs = result["variants"]
    qwen_dims = (c["hidden"], c["ffn"], c["experts"], c["top_k"]) == (2048, 768, 128, 8)
    qwen = " (Qwen3-30B-A3B's)" if qwen_dims else ""
    where = (f"experts sharded over {m['devices']} devices" if result["expert_parallel"]
             else "one device")
    lines = [
        f"# End-to-end MoE transformer training ({m['devices']} x {m['device_kind']})",
        "",
        f"`{result['command']}` at commit {result['commit']}, jax {m['jax']}, flax {m['flax']}.",
        "",
        f"Model: {c['layers']} layers, hidden {c['hidden']}, {c['heads']} query / "
        f"{c['kv_heads']} KV heads x {c['head_dim']}, MoE E={c['experts']} k={c['top_k']} "
        f"F={c['ffn']}{qwen}, vocab {c['vocab']}, seq {c['seq']}; "
        f"{result['params'] / 1e6:,.1f} M parameters; float32 master weights, bfloat16 "
        f"activations; optax.adamw with jax_mok.optim.weight_decay_mask; attention "
        f"{result['attention']}; {where}.",
        "",
        f"Step time: median of {result['steps']} synchronized steps after {result['warmup']} "
        f"warm-ups. MFU = tokens/s x {result['flops_per_token'] / 1e9:.4g} GFLOP/token / "
        f"({m['devices']} x {result['ceiling_tflops']:.1f} TFLOP/s measured bf16 matmul "
        "ceiling). FLOPs/token = 3 x [layers x (attention projections + causal attention + "
        "router + 6kHF) + LM head].",
        "",
        "| variant | batch | step ms | tokens/s | MFU (bf16 FLOPs) † | tokens/s vs jax_mok "
        "(FP8) | jax_mok speed-up | loss ‡ | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    baseline = runs.get("jax_mok")
    lines += [_row(name, run, baseline) for name, run in runs.items()]
    lines += [
        "",
        "† FP8 variants: their FP8 GEMMs are counted as BF16 FLOPs (the same FLOPs/token as "
        "every variant) against the same-run BF16 matmul ceiling, so their MFU is comparable "
        "with the BF16 rows' (a higher one is a faster step), not a utilisation of the FP8 "
        "peak. tokens/s vs jax_mok (FP8): the variant's tokens/s / the BF16 jax_mok variant's "
        "of this run; jax_mok speed-up (BF16 alternatives): jax_mok's tokens/s / theirs.",
        "",
        "‡ loss of the last timed step (computed before its own update); every variant trains "
        f"the same initial parameters on the same two batches, alternating, for "
        f"{result['warmup']} + {result['steps']} steps.",
        "",
        "Variants:",
        "",
    ]
    lines += [f"- {name}: {run['text']}" for name, run in runs.items()
              if run.get("text") and not run.get("own_best")]
    if any(run.get("own_best") for run in runs.values()):
        lines.append(f"- <variant>{OWN_BEST}: the same variant at the fastest batch per device "
                     "found by doubling from the shared batch until out of memory (its loss is "
                     "at that batch, so not comparable with the shared rows')")
    lines += _batch_search(result) + _breakdown_table(result)
    return "\n".join(lines) + "\n"


OWN_BEST = " (own best batch)"


def _batch_search(result: dict) -> list[str]:
    search = result.get("batch_search")
    if not search:
        return []
    lines = ["", f"Shared batch: the largest batch per device (from {search['start']}, halving "
             f"on out-of-memory) at which {search['anchor']} runs: **{search['shared_batch']}** "
             f"({search['anchor']}: {search['anchor_status']}); every other variant ran at it, "
             "once (a failure there is its row's status and error).", "",
             "| attempt | batch | status | tokens/s | error |", "|---|---|---|---|---|"]
    for i, a in enumerate(search["attempts"], 1):
        tps = f"{a['tokens_per_s']:,.0f}" if a.get("tokens_per_s") else ""
        lines.append(f"| {i} | {a['batch']} | {a['status']} | {tps} | "
                     f"{a.get('error', '')[:200]} |")
    return lines


def _breakdown_table(result: dict) -> list[str]:
    rows = {n: r for n, r in result["variants"].items() if r.get("breakdown")}
    if not rows:
        return []
    lines = ["", "Step-time breakdown (`--breakdown`): MoE layers (every op of jax_mok's mok_* "
             "custom calls or inside the `e2e_moe` named scope around each variant's MoE layer, "
             "routing included, forward and backward) vs the rest (attention, norms, "
             "embedding, LM head, loss, optimizer update). profile: the MoE share of the "
             "device-op time summed over the profiled steps (jax.profiler trace), applied to "
             "the median step; differential: the median step minus that of the same model "
             "with identity MoE layers (used only where no profile could be read).", "",
             "| variant | batch | step ms | MoE ms | rest ms | MoE % | method | device-op ms "
             "per step (MoE / all) |", "|---|---|---|---|---|---|---|---|"]
    for name, run in rows.items():
        b = run["breakdown"]
        if b.get("moe_ms") is None:
            lines.append(f"| {name} | {run.get('batch', '')} | - | - | - | - | {b['method']}: "
                         f"{b.get('error', '')[:150]} | |")
            continue
        ops = (f"{b['moe_op_ms_per_step']:.2f} / {b['device_op_ms_per_step']:.2f}"
               if b["method"] == "profile" else f"no-MoE step {b['no_moe_step_ms']:.1f} ms")
        method = b["method"] if b["method"] == "profile" else "DIFFERENTIAL"
        lines.append(f"| {name} | {run['batch']} | {b['step_ms']:.1f} | {b['moe_ms']:.1f} | "
                     f"{b['rest_ms']:.1f} | {100 * b['moe_fraction']:.0f} % | {method} | "
                     f"{ops} |")
    return lines


def write_markdown(result: dict, out: pathlib.Path) -> pathlib.Path:
    path = out / "e2e.md"
    path.write_text(markdown(result))
    return path


def write_plot(result: dict, out: pathlib.Path) -> pathlib.Path | None:
    """Tokens/s and MFU per variant (variants that did not run are left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {k: v for k, v in result["variants"].items() if v.get("status") == "ok"}
    if not runs:
        return None
    colors = {"jax_mok": "tab:blue", "jax_mok_fp8_block": "tab:purple",
              "jax_mok_mxfp8": "tab:red", "jax_mok_fp8_block_prepared": "tab:pink",
              "reference": "tab:orange", "padded": "tab:green"}
    split = {n: r["breakdown"] for n, r in runs.items()
             if r.get("breakdown", {}).get("moe_ms") is not None}
    fig, axes = plt.subplots(1, 3 if split else 2, figsize=(15 if split else 10, 4.5))
    names = list(runs)
    labels = [n.replace(OWN_BEST, "\n(own batch " + str(runs[n]["batch"]) + ")") for n in names]
    bar_colors = [colors.get(runs[n].get("variant", n), "gray") for n in names]
    hatches = ["//" if runs[n].get("own_best") else "" for n in names]
    for ax, key, label, scale in ((axes[0], "tokens_per_s", "tokens / s (thousands)", 1e-3),
                                  (axes[1], "mfu", "MFU (%, FP8 as bf16 FLOPs)", 100)):
        values = [runs[n][key] * scale for n in names]
        bars = ax.bar(labels, values, color=bar_colors, hatch=hatches)
        ax.bar_label(bars, fmt="%.1f")
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    if split:
        ax = axes[2]
        shown = [n for n in names if n in split]
        xs = [labels[names.index(n)] for n in shown]
        moe = [split[n]["moe_ms"] for n in shown]
        rest = [split[n]["rest_ms"] for n in shown]
        ax.bar(xs, moe, color="tab:red", label="MoE layers")
        bars = ax.bar(xs, rest, bottom=moe, color="tab:gray", label="rest")
        ax.bar_label(bars, labels=[f"{100 * split[n]['moe_fraction']:.0f} % MoE"
                                   + ("" if split[n]["method"] == "profile" else " (diff.)")
                                   for n in shown], fontsize=7)
        ax.set_ylabel("step ms (median)")
        ax.set_title("step-time breakdown", fontsize=9)
        ax.legend(fontsize=7)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    c, m = result["config"], result["machine"]
    fig.suptitle(f"{c['layers']}-layer MoE transformer (E={c['experts']}, k={c['top_k']}, "
                 f"H={c['hidden']}, F={c['ffn']}), "
                 f"{'shared ' if result.get('batch_policy') == 'shared' else ''}batch "
                 f"{result['batch']} x seq {c['seq']}, "
                 f"{m['devices']} x {m['device_kind']}" + "".join(
                     f"\nnot shown: {n} ({r.get('status')} at batch {r.get('batch')})"
                     for n, r in result["variants"].items() if r.get("status") != "ok"),
                 fontsize=9)
    fig.tight_layout()
    path = out / "e2e.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
