"""A small MoE transformer language model (Flax NNX), shared by the training examples.

Character-level, pre-norm blocks of causal self-attention + a :class:`jax_mok.nnx.MoE` in place of
the MLP. Shapes: tokens ``[B, S]`` int32 -> logits ``[B, S, V]`` float32.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_mok
import jax_mok.nnx

CORPUS = pathlib.Path(__file__).parent / "data" / "tiny_corpus.txt"


@dataclasses.dataclass(frozen=True)
class LMConfig:
    vocab_size: int
    seq_len: int = 64
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    experts: int = 8
    top_k: int = 2
    ffn: int = 64
    routing: str = "softmax"
    capacity_factor: float | None = 1.5
    quantization: str | None = None  # None, "mxfp8" or "fp8_block": the MoE's expert GEMMs
    moe_dtype: str | None = None  # the MoE layer's computation dtype (None: the model's)

    def moe_config(self) -> jax_mok.MoEConfig:
        return jax_mok.MoEConfig(num_experts=self.experts, top_k=self.top_k,
                                 hidden_size=self.hidden, ffn_size=self.ffn,
                                 routing=self.routing, capacity_factor=self.capacity_factor,
                                 quantization=self.quantization)


class Block(nnx.Module):
    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        self.attn_norm = nnx.RMSNorm(config.hidden, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(config.heads, config.hidden, decode=False,
                                           use_bias=False, rngs=rngs)
        self.moe_norm = nnx.RMSNorm(config.hidden, rngs=rngs)
        self.moe = jax_mok.nnx.MoE(config.moe_config(), dtype=config.moe_dtype, rngs=rngs,
                                   sow_aux=False)

    def __call__(self, h: jax.Array, mask: jax.Array):
        """``h [B, S, H]`` -> ``(h [B, S, H], aux)``."""
        h = h + self.attn(self.attn_norm(h), mask=mask)
        y, aux = self.moe(self.moe_norm(h), return_aux=True)
        return h + y.astype(h.dtype), aux


class MoELM(nnx.Module):
    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = nnx.Embed(config.vocab_size, config.hidden, rngs=rngs)
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.layers)])
        self.norm = nnx.RMSNorm(config.hidden, rngs=rngs)

    def __call__(self, tokens: jax.Array):
        """``tokens [B, S]`` int32 -> ``logits [B, S, V]`` float32, list of per-layer aux."""
        h = self.embed(tokens)
        mask = nnx.make_causal_mask(tokens)
        auxes = []
        for block in self.blocks:
            h, aux = block(h, mask)
            auxes.append(aux)
        return self.embed.attend(self.norm(h)), auxes


def loss_fn(model: MoELM, tokens: jax.Array, aux_weight: float = 0.01):
    """Next-token cross entropy + ``aux_weight`` x load-balancing loss; returns (loss, metrics).

    metrics: ``ce`` (float32), ``expert_counts [L, E]`` int32, ``dropped [L]`` int32.
    """
    logits, auxes = model(tokens[:, :-1])
    targets = tokens[:, 1:]
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1).mean()
    balance = sum(a["load_balancing_loss"] for a in auxes) / len(auxes)
    metrics = {
        "ce": ce,
        "expert_counts": jnp.stack([a["expert_counts"] for a in auxes]),
        "dropped": jnp.stack([a["dropped_tokens"] for a in auxes]),
    }
    return ce + aux_weight * balance, metrics


class CharData:
    """The bundled corpus as characters; batches of ``seq_len + 1`` windows (numpy, int32)."""

    def __init__(self, path: pathlib.Path = CORPUS):
        text = path.read_text(encoding="utf-8")
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.data = np.array([self.index[c] for c in text], np.int32)
        # Every 10th block of 256 characters is held out, so validation text is spread over the
        # whole corpus (its stories differ in style) rather than being its last section.
        blocks = [self.data[i:i + 256] for i in range(0, len(self.data), 256)]
        self.train = np.concatenate([b for i, b in enumerate(blocks) if i % 10 != 5])
        self.valid = np.concatenate([b for i, b in enumerate(blocks) if i % 10 == 5])

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def batch(self, rng: np.random.Generator, batch: int, seq_len: int,
              split: str = "train") -> np.ndarray:
        source = self.train if split == "train" else self.valid
        starts = rng.integers(0, len(source) - seq_len - 1, size=batch)
        return np.stack([source[s:s + seq_len + 1] for s in starts])

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)
