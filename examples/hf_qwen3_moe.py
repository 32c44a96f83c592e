"""Load a Qwen3-MoE block from a Hugging Face-style state dict and run it with jax_mok.

No download: a tiny random checkpoint with the Hub's names is built here. With a real one,
read its ``config.json`` into a dict (or pass ``transformers.AutoConfig.from_pretrained(...)``)
and its ``*.safetensors`` into a dict (``safetensors.numpy.load_file``, or torch tensors).

    python examples/hf_qwen3_moe.py
    python examples/hf_qwen3_moe.py --hidden 256 --ffn 128 --experts 32 --top-k 4
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jax_mok
import jax_mok.testing
from jax_mok import hf


def tiny_qwen3_moe_checkpoint(config: dict, layers: int, seed: int = 0) -> dict:
    """Random weights under the Hub's names for ``layers`` MoE blocks (NumPy, bfloat16)."""
    rng = np.random.default_rng(seed)
    H, F, E = config["hidden_size"], config["moe_intermediate_size"], config["num_experts"]

    def normal(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(jnp.bfloat16)

    state = {"model.embed_tokens.weight": normal(config["vocab_size"], H)}
    for layer in range(layers):
        mlp = f"model.layers.{layer}.mlp."
        state[mlp + "gate.weight"] = normal(E, H)  # the router: [E, H]
        for e in range(E):
            state[mlp + f"experts.{e}.gate_proj.weight"] = normal(F, H)
            state[mlp + f"experts.{e}.up_proj.weight"] = normal(F, H)
            state[mlp + f"experts.{e}.down_proj.weight"] = normal(H, F)
    return state


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ffn", type=int, default=32)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args(argv)

    # Field names as in Qwen3-30B-A3B's config.json (there H=2048, F=768, E=128, k=8).
    config = {"model_type": "qwen3_moe", "hidden_size": args.hidden,
              "moe_intermediate_size": args.ffn, "num_experts": args.experts,
              "num_experts_per_tok": args.top_k, "norm_topk_prob": True, "hidden_act": "silu",
              "vocab_size": 100}
    state = tiny_qwen3_moe_checkpoint(config, args.layers)
    print(f"checkpoint: {len(state)} tensors, e.g. {sorted(state)[1]}")

    x = jax.random.normal(jax.random.key(0), (args.tokens, args.hidden), jnp.bfloat16)
    layer = jax.jit(jax_mok.moe)
    result = {}
    for i in range(args.layers):
        params = hf.from_hf(state, config, prefix=f"model.layers.{i}.mlp.")
        print(f"layer {i}: router {params.router.shape} {params.router.dtype}, "
              f"w_gate_up {params.w_gate_up.shape} {params.w_gate_up.dtype}, "
              f"w_down {params.w_down.shape}")
        y = layer(x, params)
        # The same block in pure JAX (sort + ragged_dot) as a check, in float32.
        y_ref = jax_mok.reference.moe(x.astype(jnp.float32), jax_mok.testing.upcast(params))
        diff = jax_mok.testing.rel_error(y, y_ref)
        print(f"  y {y.shape} {y.dtype}; relative difference to the float32 reference "
              f"{diff:.1e}")
        # And back to the Hub's names, bit for bit.
        back = hf.to_hf(params, config, prefix=f"model.layers.{i}.mlp.", dtype=jnp.bfloat16)
        same = all(np.array_equal(v, state[k]) for k, v in back.items())
        print(f"  to_hf round trip exact: {same}")
        result[i] = {"relative_difference": diff, "round_trip": same}
    return result


if __name__ == "__main__":
    main()
