"""Train the tiny MoE LM three times — bfloat16, mxfp8, fp8_block experts — and compare losses.

Same seed, data and steps for each run; only ``MoEConfig.quantization`` differs (the MoE layers
compute in bfloat16 in all three). Writes a PNG of the three loss curves.

    python examples/fp8_tiny_moe_lm.py                      # docs/fp8_tiny_moe_lm.png
    python examples/fp8_tiny_moe_lm.py --steps 60 --plot ''  # quick check, no plot
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import train_tiny_moe_lm  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
RUNS = {"bf16": "none", "mxfp8": "mxfp8", "fp8_block": "fp8_block"}


def _optional_path(text: str) -> pathlib.Path | None:
    return pathlib.Path(text) if text else None


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plot", type=_optional_path, default=REPO / "docs" / "fp8_tiny_moe_lm.png",
                   help="PNG to write ('' to skip)")
    p.add_argument("--tail", type=int, default=20,
                   help="the final loss is the mean train loss of the last TAIL steps")
    return p.parse_known_args(argv)  # everything else goes to train_tiny_moe_lm


def main(argv=None) -> dict:
    args, train_argv = parse_args(argv)
    results = {}
    for name, recipe in RUNS.items():
        print(f"=== {name} ===", flush=True)
        results[name] = train_tiny_moe_lm.main([*train_argv, "--dtype", "bfloat16",
                                                "--quantization", recipe, "--plot", "",
                                                "--skip-checkpoint"])
    summary = {}
    for name, result in results.items():
        final = float(np.mean(result["losses"][-args.tail:]))
        summary[name] = {"final_loss": final, "valid_loss": result["valid_loss"],
                         "losses": result["losses"]}
    base = summary["bf16"]
    for name, s in summary.items():
        print(f"{name:9s}  final train loss (last {args.tail} steps) {s['final_loss']:.4f} "
              f"({100 * (s['final_loss'] / base['final_loss'] - 1):+.2f} % vs bf16)  "
              f"validation {s['valid_loss']:.4f} "
              f"({100 * (s['valid_loss'] / base['valid_loss'] - 1):+.2f} %)")
    if args.plot is not None:
        _plot(results, args.plot)
    return summary


def _plot(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_diff) = plt.subplots(1, 2, figsize=(11, 4))
    base = np.asarray(results["bf16"]["losses"])
    window = max(1, len(base) // 30)
    kernel = np.ones(window) / window
    for name, result in results.items():
        losses = np.asarray(result["losses"])
        steps = np.arange(1, len(losses) + 1)
        ax.plot(steps, losses, lw=0.6, alpha=0.35)
        color = ax.lines[-1].get_color()
        ax.plot(steps[window - 1:], np.convolve(losses, kernel, "valid"), lw=1.4, color=color,
                label=f"{name} (final valid {result['valid_loss']:.3f})")
        valid_steps, valid = zip(*result["valid"], strict=True)
        ax.plot(valid_steps, valid, "o", ms=3, color=color)
        if name != "bf16":
            ratio = np.convolve(losses / base - 1, kernel, "valid") * 100
            ax_diff.plot(steps[window - 1:], ratio, lw=1.2, color=color, label=name)
    ax.set(xlabel="step", ylabel="cross entropy (nats/char)",
           title="tiny MoE LM: bf16 vs FP8 experts (lines: train, dots: validation)")
    ax.legend()
    ax.grid(alpha=0.3)
    ax_diff.axhline(0, color="k", lw=0.8)
    ax_diff.set(xlabel="step", ylabel="train loss vs bf16 (%, smoothed)",
                title="relative difference to the bf16 run")
    ax_diff.legend()
    ax_diff.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
