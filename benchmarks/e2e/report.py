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
        return f"| {name} | {run.get('batch', '')} | - | - | - | - | - | - | " \
               f"{run.get('status')}: {run.get('error', '')[:120]} |"
    # FP8 rows: their tokens/s over jax_mok's (BF16); BF16 alternatives: jax_mok's speed-up.
    ratio = speedup = ""
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
    if run.get("oom_batches"):
        notes.append(f"out of memory at batch {run['oom_batches']}")
    return (f"| {name} | {run['batch']} | {run['step_ms_median']:.1f} | "
            f"{run['tokens_per_s']:,.0f} | {100 * run['mfu']:.1f} % | {ratio} | {speedup} | "
            f"{loss} | {'; '.join(notes)} |")


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
    lines += [f"- {name}: {run['text']}" for name, run in runs.items() if run.get("text")]
    return "\n".join(lines) + "\n"


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
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(runs)
    for ax, key, label, scale in ((axes[0], "tokens_per_s", "tokens / s (thousands)", 1e-3),
                                  (axes[1], "mfu", "MFU (%, FP8 as bf16 FLOPs)", 100)):
        values = [runs[n][key] * scale for n in names]
        bars = ax.bar(names, values, color=[colors.get(n, "gray") for n in names])
        ax.bar_label(bars, fmt="%.1f")
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    c, m = result["config"], result["machine"]
    fig.suptitle(f"{c['layers']}-layer MoE transformer (E={c['experts']}, k={c['top_k']}, "
                 f"H={c['hidden']}, F={c['ffn']}), batch {result['batch']} x seq {c['seq']}, "
                 f"{m['devices']} x {m['device_kind']}", fontsize=9)
    fig.tight_layout()
    path = out / "e2e.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
