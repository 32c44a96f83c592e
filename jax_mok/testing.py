"""Named shapes, input generators and tolerances shared by the tests and the benchmarks."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_mok.config import MoEConfig
from jax_mok.params import MoEParams, init_params


@dataclasses.dataclass(frozen=True)
class Shape:
    """One benchmark / test shape (per GPU), see ../shared/BENCHMARKS.md."""

    name: str
    model: str
    tokens: int
    hidden: int
    ffn: int
    experts: int
    top_k: int

    def config(self, **overrides) -> MoEConfig:
        return MoEConfig(num_experts=self.experts, top_k=self.top_k, hidden_size=self.hidden,
                         ffn_size=self.ffn, **overrides)

    def forward_flops(self) -> int:
        return self.config().routed_flops(self.tokens)


SHAPES = {
    s.name: s
    for s in (
        Shape("S1", "Qwen3-30B-A3B", 32768, 2048, 768, 128, 8),
        Shape("S2", "DeepSeek-V3 / Kimi-K2", 8192, 7168, 2048, 256, 8),
        Shape("S3", "Mixtral-8x7B", 16384, 4096, 14336, 8, 2),
        Shape("S4", "MoK test shape (DeepSeek-V4-Pro)", 7168, 7168, 3072, 384, 6),
        Shape("S5", "decode-sized batch", 128, 7168, 2048, 256, 8),
        Shape("S6", "small / many experts", 8192, 2048, 2048, 32, 2),
    )
}

# Presets for `python -m jax_mok bench --preset ...` (the model's layer; tokens set separately).
PRESETS = {
    "qwen3-30b-a3b": MoEConfig(num_experts=128, top_k=8, hidden_size=2048, ffn_size=768),
    "deepseek-v3": MoEConfig(num_experts=256, top_k=8, hidden_size=7168, ffn_size=2048,
                             routing="sigmoid", n_group=8, topk_group=4,
                             routed_scaling_factor=2.5, num_shared_experts=1),
    "mixtral-8x7b": MoEConfig(num_experts=8, top_k=2, hidden_size=4096, ffn_size=14336),
    "tiny": MoEConfig(num_experts=8, top_k=2, hidden_size=256, ffn_size=128),
}

# Relative Frobenius error ||got - want|| / ||want|| allowed against a float32 reference.
#  - float32 kernels: only summation order differs (GEMM blocking, k-reduction), so ~1e-6 is
#    typical; 1e-4 leaves room for H, F in the thousands.
#  - bfloat16 kernels: operands are rounded to 8 mantissa bits (relative 2^-9 ≈ 2e-3 per
#    element), the activation is rounded again before the down GEMM, and on CUDA each
#    assignment's output row (and dx row) once more before the float32 sum over k, as a PyTorch
#    grouped_mm + index_add_ does; the errors are independent, so the norm-wise error lands near
#    3e-3..6e-3. 1e-2 is the contract (issue 4).
TOLERANCE = {jnp.dtype(jnp.float32): 1e-4, jnp.dtype(jnp.bfloat16): 1e-2}


# The router's gradient is the one derived quantity with cancellation in it: with normalised
# top-k weights, d_logits_t = s_t * (d_w_t - <w_t, d_w_t>) is a difference of nearly equal terms,
# so the bf16 rounding of d_topk_weights (relative ~3e-3) is amplified by |d_w| / |d_w - mean|,
# which reaches ~10 for a single token. Averaging over many tokens shrinks it again. Measured:
# 4e-2 for T=1, below 1e-2 from T=64 up. float32 keeps 1e-4 (no amplification at that level).
ROUTER_GRAD_TOLERANCE = {jnp.dtype(jnp.float32): 1e-4, jnp.dtype(jnp.bfloat16): 6e-2}


def tolerance(dtype, *, router_grad: bool = False) -> float:
    table = ROUTER_GRAD_TOLERANCE if router_grad else TOLERANCE
    return table[jnp.dtype(dtype)]


def rel_error(got, want) -> float:
    """||got - want||_F / ||want||_F in float64 (NaN if either has a NaN)."""
    got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
    want = np.asarray(jnp.asarray(want, jnp.float32), np.float64)
    denom = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / (denom if denom > 0 else 1.0))


def random_routing(key, tokens: int, experts: int, top_k: int, skew: float = 0.0):
    """Routing ids [T, k] int32 (distinct per token) and weights [T, k] float32.

    ``skew=0`` is balanced (softmax over random logits). ``skew > 0`` adds a bias to the first 10 %
    of experts (at least one) so that they receive a larger share; ``skew=3.0`` sends roughly half
    of the assignments to 10 % of the experts for E in the hundreds.
    """
    k_logits, _ = jax.random.split(key)
    logits = jax.random.normal(k_logits, (tokens, experts), jnp.float32)
    hot = max(1, experts // 10)
    logits = logits.at[:, :hot].add(skew)
    scores = jax.nn.softmax(logits, -1)
    weights, ids = jax.lax.top_k(scores, top_k)
    weights = weights / weights.sum(-1, keepdims=True)
    return ids.astype(jnp.int32), weights.astype(jnp.float32)


def random_inputs(key, shape: Shape, dtype=jnp.bfloat16, skew: float = 0.0):
    """(x [T, H], ids, weights, w_gate_up, w_down) for the routed-expert kernels."""
    k_x, k_r, k_p = jax.random.split(key, 3)
    params = init_params(k_p, shape.config(), dtype=dtype)
    x = jax.random.normal(k_x, (shape.tokens, shape.hidden), jnp.float32).astype(dtype)
    ids, weights = random_routing(k_r, shape.tokens, shape.experts, shape.top_k, skew)
    return x, ids, weights, params.w_gate_up, params.w_down


def random_params(key, config: MoEConfig, dtype=jnp.float32) -> MoEParams:
    """init_params plus a random router_bias (sigmoid routing), so no test runs on zeros."""
    params = init_params(key, config, dtype=dtype)
    if params.router_bias is not None:
        bias = 0.1 * jax.random.normal(jax.random.fold_in(key, 7), params.router_bias.shape)
        params = dataclasses.replace(params, router_bias=bias)
    return params


def upcast(tree):
    """Casts every floating leaf to float32 (the reference's precision)."""
    return jax.tree.map(
        lambda a: a.astype(jnp.float32)
        if hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating) else a,
        tree,
    )
