"""Train a tiny MoE transformer LM (Flax NNX + optax) on the corpus shipped in examples/data.

Shows the loss falling, per-expert load and dropped assignments, an orbax checkpoint saved and
restored (the restored model gives the same loss), and a PNG of loss + expert utilisation.

    python examples/train_tiny_moe_lm.py                   # ~1 min on 2 CPU cores
    python examples/train_tiny_moe_lm.py --steps 2000 --hidden 128 --layers 4
    python examples/train_tiny_moe_lm.py --routing sigmoid --bias-rate 1e-2   # aux-loss-free
    python examples/train_tiny_moe_lm.py --dtype bfloat16 --quantization mxfp8  # FP8 experts
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from moe_lm import CharData, LMConfig, MoELM, loss_fn  # noqa: E402

import jax_mok.nnx  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent


def _optional_path(text: str) -> pathlib.Path | None:
    return pathlib.Path(text) if text else None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--ffn", type=int, default=64)
    p.add_argument("--routing", choices=("softmax", "sigmoid"), default="softmax")
    p.add_argument("--capacity-factor", type=float, default=1.5,
                   help="per-expert capacity factor; 0 = dropless")
    p.add_argument("--bias-rate", type=float, default=1e-2,
                   help="aux-loss-free balancing step for --routing sigmoid")
    p.add_argument("--quantization", choices=("none", "mxfp8", "fp8_block"), default="none",
                   help="FP8 recipe of the MoE expert GEMMs (MoEConfig.quantization)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="computation dtype of the MoE layers")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", type=_optional_path, default=REPO / "docs" / "tiny_moe_lm.png",
                   help="PNG to write ('' to skip)")
    p.add_argument("--checkpoint-dir", type=pathlib.Path, default=None,
                   help="default: a temporary directory, removed at exit")
    p.add_argument("--skip-checkpoint", action="store_true",
                   help="skip the orbax save / restore check")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    data = CharData()
    config = LMConfig(vocab_size=data.vocab_size, seq_len=args.seq_len, hidden=args.hidden,
                      layers=args.layers, experts=args.experts, top_k=args.top_k, ffn=args.ffn,
                      routing=args.routing,
                      capacity_factor=args.capacity_factor or None,
                      quantization=None if args.quantization == "none" else args.quantization,
                      moe_dtype=args.dtype)
    model = MoELM(config, rngs=nnx.Rngs(args.seed))
    optimizer = nnx.Optimizer(model, optax.adamw(args.lr, weight_decay=args.weight_decay),
                              wrt=nnx.Param)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    print(f"tiny MoE LM: {n_params:,} parameters, vocab {data.vocab_size}, "
          f"{config.layers} layers x {config.experts} experts (top-{config.top_k}), "
          f"routing={config.routing}, capacity_factor={config.capacity_factor}, "
          f"MoE dtype={args.dtype}, quantization={args.quantization}, "
          f"backend={jax.default_backend()}", flush=True)

    @nnx.jit
    def train_step(model, optimizer, tokens):
        (loss, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, tokens)
        optimizer.update(model, grads)
        return loss, metrics

    @nnx.jit
    def eval_loss(model, tokens):
        return loss_fn(model, tokens)[1]["ce"]

    rng = np.random.default_rng(args.seed)
    valid = jnp.asarray(data.batch(np.random.default_rng(1234), 64, args.seq_len, "valid"))
    history = {"step": [], "loss": [], "load": [], "dropped": [], "valid": []}
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        tokens = jnp.asarray(data.batch(rng, args.batch, args.seq_len))
        loss, metrics = train_step(model, optimizer, tokens)
        counts = np.asarray(metrics["expert_counts"])  # [L, E]
        if config.routing == "sigmoid" and args.bias_rate:
            _update_biases(model, counts, args.bias_rate)
        history["step"].append(step)
        history["loss"].append(float(metrics["ce"]))
        history["load"].append(counts / counts.sum(-1, keepdims=True).clip(1))
        history["dropped"].append(int(np.asarray(metrics["dropped"]).sum()))
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            share = " ".join(f"{s:.2f}" for s in history["load"][-1].mean(0))
            history["valid"].append((step, float(eval_loss(model, valid))))
            print(f"step {step:5d}  loss {history['loss'][-1]:.3f}  "
                  f"valid {history['valid'][-1][1]:.3f}  "
                  f"dropped {history['dropped'][-1]:4d}/{counts.sum() + history['dropped'][-1]}"
                  f"  load share per expert [{share}]  {time.perf_counter() - start:6.1f}s",
                  flush=True)

    print(f"trained {args.steps} steps in {time.perf_counter() - start:.1f}s", flush=True)
    valid_loss = float(eval_loss(model, valid))
    print(f"validation loss {valid_loss:.3f}  (first train loss {history['loss'][0]:.3f})")

    restored_loss = None
    if not args.skip_checkpoint:
        restored_loss = _checkpoint_round_trip(model, config, args, valid, eval_loss, valid_loss)
        print(f"checkpoint round trip done at {time.perf_counter() - start:.1f}s", flush=True)
    if args.plot is not None:
        _plot(history, config, args.plot)
    return {"losses": history["loss"], "valid_loss": valid_loss, "restored_loss": restored_loss,
            "dropped": history["dropped"], "valid": history["valid"]}


def _update_biases(model: MoELM, counts: np.ndarray, rate: float) -> None:
    """Aux-loss-free balancing: each layer's bias moves by its own load (counts [L, E])."""
    for block, layer_counts in zip(model.blocks, counts, strict=True):
        jax_mok.nnx.update_router_bias(block.moe, jnp.asarray(layer_counts), rate=rate)


def _checkpoint_round_trip(model, config, args, valid, eval_loss, valid_loss) -> float:
    """Saves the model state with orbax, restores it into a fresh model, checks the loss."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = (args.checkpoint_dir or pathlib.Path(tmp)).resolve()
        path = directory / "tiny_moe_lm"
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(path, nnx.state(model), force=True)
        checkpointer.wait_until_finished()
        fresh = nnx.eval_shape(lambda: MoELM(config, rngs=nnx.Rngs(0)))
        graphdef, abstract = nnx.split(fresh)
        restored = nnx.merge(graphdef, checkpointer.restore(path, abstract))
        restored_loss = float(eval_loss(restored, valid))
    print(f"checkpoint: saved + restored ({path.name}), validation loss {restored_loss:.3f} "
          f"(before save {valid_loss:.3f})", flush=True)
    if abs(restored_loss - valid_loss) > 1e-5:
        raise RuntimeError(f"restored model's loss {restored_loss} != {valid_loss}")
    return restored_loss


def _plot(history: dict, config: LMConfig, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    load = np.stack(history["load"])  # [steps, L, E]
    fig, (ax_loss, ax_load) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot(history["step"], history["loss"], lw=1, label="train")
    ax_loss.plot(*zip(*history["valid"], strict=True), "o-", ms=3, label="validation")
    ax_loss.legend()
    ax_loss.set(xlabel="step", ylabel="cross entropy (nats/char)",
                title="tiny MoE LM: loss")
    ax_loss.grid(alpha=0.3)
    window = max(1, len(history["step"]) // 20)
    kernel = np.ones(window) / window
    for e in range(config.experts):
        share = np.convolve(load[:, :, e].mean(1), kernel, mode="valid")
        ax_load.plot(history["step"][window - 1:], share, lw=1, label=f"expert {e}")
    ax_load.axhline(1.0 / config.experts, color="k", ls="--", lw=0.8,
                    label="balanced")
    ax_load.set(xlabel="step", ylabel="share of routed assignments (mean over layers)",
                title=f"expert utilisation ({config.routing} routing)")
    ax_load.legend(fontsize=7, ncol=2)
    ax_load.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
