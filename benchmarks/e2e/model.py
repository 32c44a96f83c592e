"""The end-to-end model: a decoder-only MoE transformer in Flax NNX, and its FLOP count.

Pre-norm blocks ``h += attn(rms(h)); h += moe(rms(h))``, stacked with ``nnx.vmap`` and run with
``nnx.scan`` (one compiled layer body whatever the depth). Attention: grouped-query projections
(``nnx.Linear``) around ``jax.nn.dot_product_attention(is_causal=True)`` (cuDNN flash attention on
the GPU; ``flax.nnx.MultiHeadAttention`` has no GQA and materialises the ``S x S`` scores, 8.6 GB
per layer at 8 x 4096 tokens and 32 heads); no rotary embedding (it costs no matmul FLOPs). The MoE
is :class:`jax_mok.nnx.MoE` in every variant, only its ``moe_fn`` and its config's
``quantization`` differ, so all variants train the same parameters. Precision: float32 master
weights (``param_dtype``), bfloat16 activations and GEMM operands (``dtype``), float32 router,
softmax and loss; the FP8 variants' routed-expert GEMMs read E4M3 operands
(``MoEConfig(quantization=...)``, :mod:`jax_mok.fp8`), everything else as in ``jax_mok``.

Every block's MoE goes through :func:`moe_forward`. The ``_prepared`` variant gives it FP8 expert
weights prepared once per optimizer step (:func:`prepare_fp8_weights`, from the step's current
parameters, before the gradient); it needs ``jax_mok.fp8_weights`` (:func:`unavailable_reason`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

import jax_mok
import jax_mok.nnx
from benchmarks.e2e.breakdown import MOE_SCOPE  # named scope of every MoE layer
from jax_mok import reference, routing

VARIANTS = ("jax_mok", "jax_mok_fp8_block", "jax_mok_mxfp8", "jax_mok_fp8_block_prepared",
            "reference", "padded")
# MoEConfig.quantization of each FP8 variant (the others: None, the BF16 layer).
QUANTIZATION = {"jax_mok_fp8_block": "fp8_block", "jax_mok_mxfp8": "mxfp8",
                "jax_mok_fp8_block_prepared": "fp8_block"}
# Variants whose expert weights are quantized once per optimizer step (jax_mok.fp8_weights).
PREPARED = frozenset({"jax_mok_fp8_block_prepared"})
VARIANT_TEXT = {
    "jax_mok": "jax_mok.moe (default implementation: the kernels where built)",
    "jax_mok_fp8_block": "jax_mok.moe with MoEConfig(quantization='fp8_block'): E4M3, 1 x 128 "
                         "activation / 128 x 128 weight float32 scales (DeepSeek-V3)",
    "jax_mok_mxfp8": "jax_mok.moe with MoEConfig(quantization='mxfp8'): E4M3, E8M0 scale per 32 "
                     "elements (OCP MX)",
    "jax_mok_fp8_block_prepared": "jax_mok_fp8_block with the expert weights quantized once per "
                                  "optimizer step (jax_mok.fp8_weights, passed as "
                                  "jax_mok.moe(..., fp8_weights=w))",
    "reference": "jax_mok.moe(implementation='reference'): sort + lax.ragged_dot, pure XLA",
    "padded": "padded batched einsum (benchmarks B2: reference.routed_experts_padded)",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Qwen3-30B-A3B's MoE and attention dimensions by default; ``layers`` and ``vocab`` are
    the benchmark's (the real model has 48 layers and a 151936-token vocabulary)."""

    layers: int = 6
    hidden: int = 2048
    ffn: int = 768
    experts: int = 128
    top_k: int = 8
    heads: int = 32
    kv_heads: int = 4
    head_dim: int = 128
    vocab: int = 8192
    seq: int = 4096
    aux_loss_weight: float = 1e-3  # Qwen3-MoE's router_aux_loss_coef
    quantization: str | None = None  # the MoE's MoEConfig.quantization (None: BF16 GEMMs)

    def moe_config(self) -> jax_mok.MoEConfig:
        return jax_mok.MoEConfig(num_experts=self.experts, top_k=self.top_k,
                                 hidden_size=self.hidden, ffn_size=self.ffn, norm_topk_prob=True,
                                 quantization=self.quantization)

    def flops_per_token(self) -> dict:
        """Model FLOPs per token of one training step (forward + backward = 3 x forward).

        The same count whatever ``quantization``: FP8 GEMMs count as their BF16 FLOPs (MFU is
        taken against the BF16 matmul ceiling for every variant).

        Per layer, forward: attention projections ``2 H (Nq D + 2 Nkv D) + 2 Nq D H``; causal
        attention ``2 S Nq D`` (QK^T and PV, ``4 S Nq D``, halved by the causal mask); router
        ``2 H E``; routed experts ``6 k H F``. Plus the LM head ``2 H V``. Norms, softmax,
        routing and the embedding lookup are not counted.
        """
        H, D, Nq, Nkv = self.hidden, self.head_dim, self.heads, self.kv_heads
        per_layer = {
            "attention_projections": 2 * H * (Nq * D + 2 * Nkv * D) + 2 * Nq * D * H,
            "attention_core": 2 * self.seq * Nq * D,
            "router": 2 * H * self.experts,
            "routed_experts": 6 * self.top_k * H * self.ffn,
        }
        forward = self.layers * sum(per_layer.values()) + 2 * H * self.vocab
        return {"per_layer_forward": per_layer, "lm_head_forward": 2 * H * self.vocab,
                "train": 3 * forward}

    def param_count(self) -> int:
        H, D = self.hidden, self.head_dim
        attn = H * D * (2 * self.heads + 2 * self.kv_heads)
        moe = H * self.experts + 3 * self.experts * H * self.ffn
        return self.layers * (attn + moe + 2 * H) + 2 * self.vocab * H + H


class PaddedMoE:
    """``moe_fn`` of the padded-einsum variant: jax_mok's routing, assignments past
    ``capacity`` per expert dropped, then :func:`jax_mok.reference.routed_experts_padded`.

    With ``capacity=None`` it runs :func:`jax_mok.moe` instead (used once to measure the
    expert counts that size the capacity). Hashed by identity (a static module attribute).
    """

    def __init__(self):
        self.capacity: int | None = None

    def __call__(self, x, params, *, return_aux=False):
        if self.capacity is None:
            return jax_mok.moe(x, params, return_aux=return_aux)
        config = params.config
        x2d = x.reshape(-1, config.hidden_size)
        r, routed_ids = routing.route(x2d, params.router, params.router_bias, config)
        rank, _ = routing.rank_in_group(r.topk_ids.reshape(-1), config.num_experts)
        kept = jnp.where(rank < self.capacity, r.topk_ids.reshape(-1), routing.DROPPED)
        kept = kept.reshape(r.topk_ids.shape)
        y = reference.routed_experts_padded(x2d, kept, r.topk_weights,
                                            params.w_gate_up.astype(x.dtype),
                                            params.w_down.astype(x.dtype), self.capacity)
        y = y.reshape(x.shape)
        if not return_aux:
            return y
        r = dataclasses.replace(r, topk_ids=kept,
                                expert_counts=routing.count_per_expert(kept, config.num_experts),
                                dropped=jnp.sum(kept < 0).astype(jnp.int32))
        return y, routing.aux_losses(r, routed_ids, config)


def variant_config(variant: str, cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with the variant's MoE quantization (the model is otherwise the same)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return dataclasses.replace(cfg, quantization=QUANTIZATION.get(variant))


def unavailable_reason(variant: str) -> str | None:
    """Why this jax_mok cannot run ``variant`` (None: it can)."""
    if variant in PREPARED and not hasattr(jax_mok, "fp8_weights"):
        return ("not available in this jax_mok: it has no jax_mok.fp8_weights (FP8 expert "
                "weights prepared once per optimizer step)")
    return None


def moe_fn_for(variant: str, mesh=None):
    """The ``moe_fn`` of a variant (``mesh``: expert parallelism over its "expert" axis). The
    FP8 variants take jax_mok's: their quantization is in the layer's config."""
    if variant == "jax_mok" or variant in QUANTIZATION:
        return functools.partial(jax_mok.moe, mesh=mesh) if mesh is not None else None
    if variant == "reference":
        return functools.partial(jax_mok.moe, implementation="reference", mesh=mesh)
    if variant == "padded":
        if mesh is not None:
            raise ValueError("the padded variant runs on one device only (no expert parallelism)")
        return PaddedMoE()
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


def prepare_fp8_weights(model: MoETransformer):
    """FP8 expert weights of every layer (leading axis: the layer, as the stacked blocks), from
    the model's current parameters: ``jax_mok.fp8_weights`` of each layer's
    :class:`jax_mok.MoEParams`. Called once per optimizer step, before the gradient (so it is
    not differentiated; the layer's custom VJP gives the master weights their gradient), and
    shared by every micro-batch of the step (`--micro-batches`)."""
    if (reason := unavailable_reason("jax_mok_fp8_block_prepared")) is not None:
        raise NotImplementedError(f"jax_mok_fp8_block_prepared: {reason}")
    # The layer quantizes its weights in its compute dtype (bf16 here; the masters are f32).
    make = functools.partial(jax_mok.fp8_weights, dtype=model.blocks.moe.dtype)
    return jax.vmap(make)(model.blocks.moe.to_params())


def moe_forward(moe: jax_mok.nnx.MoE, x: jax.Array, fp8_weights=None):
    """The MoE of a block: ``(y, aux)`` of ``x [B, S, H]``. ``fp8_weights``: this layer's FP8
    expert weights prepared for the step (:func:`prepare_fp8_weights`), or None (the layer
    quantizes its weights itself where its config says FP8).

    Inside the named scope :data:`MOE_SCOPE` (every variant), which the step-time breakdown
    (``benchmarks/e2e/breakdown.py``) finds in the compiled ops' ``op_name`` metadata."""
    with jax.named_scope(MOE_SCOPE):
        return moe(x, return_aux=True, fp8_weights=fp8_weights)


def identity_moe_forward(moe: jax_mok.nnx.MoE, x: jax.Array, fp8_weights=None):
    """The differential breakdown's stand-in for :func:`moe_forward`: ``y = 0`` (the block adds
    nothing) and zero aux, the layer's parameters kept but unused."""
    del fp8_weights
    E = moe.config.num_experts
    zero = jnp.zeros((), jnp.float32)
    aux = {"load_balancing_loss": zero, "router_z_loss": zero,
           "expert_counts": jnp.zeros((E,), jnp.int32), "dropped_tokens": jnp.zeros((), jnp.int32)}
    return jnp.zeros_like(x), aux


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, implementation: str | None, *, rngs: nnx.Rngs):
        kw = dict(use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=rngs)
        q_width, kv_width = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.q = nnx.Linear(cfg.hidden, q_width, **kw)
        self.k = nnx.Linear(cfg.hidden, kv_width, **kw)
        self.v = nnx.Linear(cfg.hidden, kv_width, **kw)
        self.o = nnx.Linear(q_width, cfg.hidden, **kw)
        self.shape = (cfg.heads, cfg.kv_heads, cfg.head_dim)
        self.implementation = implementation

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [B, S, H]`` bf16 -> ``[B, S, H]`` bf16, causal."""
        B, S, _ = x.shape
        heads, kv_heads, dim = self.shape
        q = self.q(x).reshape(B, S, heads, dim)
        k = self.k(x).reshape(B, S, kv_heads, dim)
        v = self.v(x).reshape(B, S, kv_heads, dim)
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                           implementation=self.implementation)
        return self.o(out.reshape(B, S, heads * dim))


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, moe_fn, attention: str | None, *, rngs: nnx.Rngs,
                 identity_moe: bool = False):
        norm = dict(dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=rngs)
        self.attn_norm = nnx.RMSNorm(cfg.hidden, **norm)
        self.attn = Attention(cfg, attention, rngs=rngs)
        self.moe_norm = nnx.RMSNorm(cfg.hidden, **norm)
        self.moe = jax_mok.nnx.MoE(cfg.moe_config(), dtype=jnp.bfloat16, param_dtype=jnp.float32,
                                   rngs=rngs, sow_aux=False, moe_fn=moe_fn)
        self.identity_moe = identity_moe

    def __call__(self, h: jax.Array, fp8_weights=None):
        h = h + self.attn(self.attn_norm(h))
        forward = identity_moe_forward if self.identity_moe else moe_forward
        y, aux = forward(self.moe, self.moe_norm(h), fp8_weights)
        return h + y, aux


class MoETransformer(nnx.Module):
    """``tokens [B, S]`` int32 -> ``(logits [B, S, V] float32, aux stacked over layers)``;
    ``fp8_weights``: :func:`prepare_fp8_weights`' (scanned with the blocks) or None."""

    def __init__(self, cfg: ModelConfig, moe_fn, *, attention: str | None = None,
                 remat: bool = False, rngs: nnx.Rngs, identity_moe: bool = False):
        self.embed = nnx.Embed(cfg.vocab, cfg.hidden, dtype=jnp.bfloat16,
                               param_dtype=jnp.float32, rngs=rngs)

        @nnx.split_rngs(splits=cfg.layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make_blocks(rngs):
            return Block(cfg, moe_fn, attention, rngs=rngs, identity_moe=identity_moe)

        self.blocks = make_blocks(rngs)
        self.norm = nnx.RMSNorm(cfg.hidden, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                                rngs=rngs)
        self.head = nnx.Linear(cfg.hidden, cfg.vocab, use_bias=False, dtype=jnp.bfloat16,
                               param_dtype=jnp.float32, rngs=rngs)
        self.remat = remat

    def __call__(self, tokens: jax.Array, fp8_weights=None):
        def layer(block, h, w):
            return block(h, w)

        if self.remat:
            layer = nnx.remat(layer)

        @nnx.scan(in_axes=(0, nnx.Carry, 0), out_axes=(nnx.Carry, 0))
        def run(block, h, w):
            return layer(block, h, w)

        h, aux = run(self.blocks, self.embed(tokens), fp8_weights)
        return self.head(self.norm(h)).astype(jnp.float32), aux


def loss_fn(model: MoETransformer, tokens: jax.Array, aux_weight: float, fp8_weights=None):
    """Next-token cross entropy + ``aux_weight`` x the layers' summed load-balancing loss.

    ``tokens [B, S + 1]``; ``fp8_weights``: see :class:`MoETransformer`. Returns
    ``(loss, metrics)`` with ``expert_counts [L, E]`` and ``dropped [L]``.
    """
    logits, aux = model(tokens[:, :-1], fp8_weights)
    logp = jax.nn.log_softmax(logits)
    ce = -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()
    loss = ce + aux_weight * aux["load_balancing_loss"].sum()
    return loss, {"ce": ce, "expert_counts": aux["expert_counts"],
                  "dropped": aux["dropped_tokens"]}


def accumulated_value_and_grad(model: MoETransformer, tokens: jax.Array, aux_weight: float,
                               fp8_weights=None):
    """Gradient accumulation over micro-batches: ``tokens [M, B, S + 1]`` run one after the
    other by a ``lax.scan`` (one micro-batch's activations live at a time), sharing
    ``fp8_weights``. Returns ``(loss, grads, dropped)``: the mean of the M losses, the mean of
    their gradients (an ``nnx.State`` of the model's Params, as ``nnx.value_and_grad`` gives)
    and the dropped assignments summed over every layer and micro-batch."""
    model_def, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_of(params, toks):
        return loss_fn(nnx.merge(model_def, params, rest), toks, aux_weight, fp8_weights)

    value_and_grad = jax.value_and_grad(loss_of, has_aux=True)

    def body(carry, toks):
        grads, loss, dropped = carry
        (value, metrics), g = value_and_grad(params, toks)
        return (jax.tree.map(jnp.add, grads, g), loss + value.astype(jnp.float32),
                dropped + metrics["dropped"].sum().astype(jnp.int32)), None

    zero = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32),
            jnp.zeros((), jnp.int32))
    (grads, loss, dropped), _ = jax.lax.scan(body, zero, tokens)
    micro = tokens.shape[0]
    return loss / micro, jax.tree.map(lambda g: g / micro, grads), dropped
