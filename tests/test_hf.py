"""jax_mok.hf: each model's MoE block re-implemented in NumPy from transformers' code (float64)
on random checkpoints in both layouts, against jax_mok.moe on from_hf params; round trips;
FP8 dequantisation; errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mok
from jax_mok import hf, testing
from jax_mok.kernels import _ffi

IMPLS = ["reference"] + (["cpu"] if _ffi.kernels_built("cpu") else [])
CONFIGS = {
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=32, moe_intermediate_size=16,
                      num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                      hidden_act="silu"),
    "qwen3_moe_unnormed": dict(model_type="qwen3_moe", hidden_size=32, moe_intermediate_size=16,
                               num_experts=8, num_experts_per_tok=3, norm_topk_prob=False),
    "qwen2_moe": dict(model_type="qwen2_moe", hidden_size=32, moe_intermediate_size=8,
                      shared_expert_intermediate_size=24, num_experts=6, num_experts_per_tok=2,
                      norm_topk_prob=False, hidden_act="silu"),
    "mixtral": dict(model_type="mixtral", hidden_size=32, intermediate_size=16,
                    num_local_experts=8, num_experts_per_tok=2, router_jitter_noise=0.0),
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=32, moe_intermediate_size=16,
                        n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                        routed_scaling_factor=2.5, norm_topk_prob=True, n_shared_experts=2,
                        scoring_func="sigmoid", topk_method="noaux_tc"),
}
HUB = {"mixtral": ("w1", "w3", "w2")}


@pytest.fixture(autouse=True)
def _on_cpu():
    """float32 comparisons at 1e-5 need exact float32 GEMMs: run JAX on the CPU even where a GPU
    is the default (a GPU may use TF32 for float32 products)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _dims(cfg):
    E = cfg.get("num_experts", cfg.get("num_local_experts", cfg.get("n_routed_experts")))
    F = cfg.get("moe_intermediate_size", cfg.get("intermediate_size"))
    return E, cfg["hidden_size"], F


def _random_fused(cfg, seed, dtype=np.float32) -> dict:
    """A random block in the transformers-5 layout (names relative to the block)."""
    rng = np.random.default_rng(seed)
    E, H, F = _dims(cfg)

    def normal(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    sd = {"gate.weight": normal(E, H, scale=H**-0.5),
          "experts.gate_up_proj": normal(E, 2 * F, H, scale=H**-0.5),
          "experts.down_proj": normal(E, H, F, scale=F**-0.5)}
    kind = cfg["model_type"]
    if kind == "qwen2_moe":
        S = cfg["shared_expert_intermediate_size"]
        sd.update({"shared_expert.gate_proj.weight": normal(S, H, scale=H**-0.5),
                   "shared_expert.up_proj.weight": normal(S, H, scale=H**-0.5),
                   "shared_expert.down_proj.weight": normal(H, S, scale=S**-0.5),
                   "shared_expert_gate.weight": normal(1, H, scale=H**-0.5)})
    if kind == "deepseek_v3":
        S = cfg["n_shared_experts"] * F
        sd.update({"gate.e_score_correction_bias": (0.3 * rng.standard_normal(E))
                   .astype(np.float32),
                   "shared_experts.gate_proj.weight": normal(S, H, scale=H**-0.5),
                   "shared_experts.up_proj.weight": normal(S, H, scale=H**-0.5),
                   "shared_experts.down_proj.weight": normal(H, S, scale=S**-0.5)})
    return sd


def _to_hub(sd: dict, kind: str) -> dict:
    """The Hub layout of a fused block, written out here (not with jax_mok.hf)."""
    gate_n, up_n, down_n = HUB.get(kind, ("gate_proj", "up_proj", "down_proj"))
    out = {k: v for k, v in sd.items() if not k.startswith("experts.")}
    gate_up, down = sd["experts.gate_up_proj"], sd["experts.down_proj"]
    F = down.shape[2]
    for e in range(gate_up.shape[0]):
        out[f"experts.{e}.{gate_n}.weight"] = gate_up[e, :F]
        out[f"experts.{e}.{up_n}.weight"] = gate_up[e, F:]
        out[f"experts.{e}.{down_n}.weight"] = down[e]
    return out


def _silu(v):
    return v / (1.0 + np.exp(-v))


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _top(values, k):
    return np.argsort(-values, axis=-1, kind="stable")[:, :k]


def _mlp(x, sd, prefix):
    g = x @ sd[prefix + "gate_proj.weight"].T
    u = x @ sd[prefix + "up_proj.weight"].T
    return (_silu(g) * u) @ sd[prefix + "down_proj.weight"].T


def numpy_block(sd: dict, cfg: dict, x: np.ndarray) -> np.ndarray:
    """The block's forward as transformers 5 writes it, in float64 on a fused-layout dict."""
    sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    kind, k = cfg["model_type"], cfg["num_experts_per_tok"]
    logits = x @ sd["gate.weight"].T  # [T, E]
    if kind == "deepseek_v3":
        scores = _sigmoid(logits)
        choice = scores + sd["gate.e_score_correction_bias"]
        T, E = choice.shape
        groups = choice.reshape(T, cfg["n_group"], -1)
        group_scores = np.sort(groups, axis=-1)[..., -2:].sum(-1)  # two best per group
        keep = np.zeros_like(group_scores, bool)
        np.put_along_axis(keep, _top(group_scores, cfg["topk_group"]), True, axis=-1)
        choice = np.where(np.repeat(keep, E // cfg["n_group"], axis=1), choice, -np.inf)
        ids = _top(choice, k)
        w = np.take_along_axis(scores, ids, -1)
        if cfg["norm_topk_prob"]:
            w = w / (w.sum(-1, keepdims=True) + 1e-20)
        w = w * cfg["routed_scaling_factor"]
    else:
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ids = _top(probs, k)
        w = np.take_along_axis(probs, ids, -1)
        if kind == "mixtral" or cfg.get("norm_topk_prob"):
            w = w / w.sum(-1, keepdims=True)
    gate_up, down = sd["experts.gate_up_proj"], sd["experts.down_proj"]
    F = down.shape[2]
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            h = gate_up[ids[t, j]] @ x[t]
            y[t] += w[t, j] * (down[ids[t, j]] @ (_silu(h[:F]) * h[F:]))
    if kind == "qwen2_moe":
        y += _sigmoid(x @ sd["shared_expert_gate.weight"].T) * _mlp(x, sd, "shared_expert.")
    if kind == "deepseek_v3":
        y += _mlp(x, sd, "shared_experts.")
    return y


@functools.cache
def _jitted_moe(impl):
    """``jax_mok.moe`` jitted once per implementation: both layouts of a config load to the same
    shapes, so they share one compiled layer (the reference's eager op-by-op dispatch compiled
    ~70 ops per config instead)."""
    return jax.jit(functools.partial(jax_mok.moe, implementation=impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", ["hub", "fused"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_block_matches_numpy(name, layout, impl):
    """float32 jax_mok vs float64 NumPy: 1e-5 relative covers float32 GEMM rounding."""
    cfg = CONFIGS[name]
    sd = _random_fused(cfg, seed=len(name))
    loaded = sd if layout == "fused" else _to_hub(sd, cfg["model_type"])
    params = hf.from_hf({"model.layers.1.mlp." + k: v for k, v in loaded.items()}, cfg,
                        prefix="model.layers.1.mlp")
    x = np.random.default_rng(7).standard_normal((45, cfg["hidden_size"])).astype(np.float32)
    y = _jitted_moe(impl)(jnp.asarray(x), params)
    want = numpy_block(sd, cfg, x.astype(np.float64))
    assert testing.rel_error(y, want) <= 1e-5


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", ["hub", "fused"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip(name, layout, dtype):
    cfg = CONFIGS[name]
    sd = _random_fused(cfg, seed=3, dtype=dtype)
    if "gate.e_score_correction_bias" in sd:  # transformers keeps it float32
        sd["gate.e_score_correction_bias"] = sd["gate.e_score_correction_bias"].astype(np.float32)
    if layout == "hub":
        sd = _to_hub(sd, cfg["model_type"])
    params = hf.from_hf(sd, cfg)
    assert params.router.dtype == jnp.float32 and params.w_gate_up.dtype == jnp.dtype(dtype)
    back = hf.to_hf(params, cfg, layout=layout, dtype=dtype, prefix="blk")
    assert sorted(back) == sorted("blk." + k for k in sd)
    for key, value in sd.items():
        got = back["blk." + key]
        assert got.dtype == value.dtype, key
        np.testing.assert_array_equal(got, value, err_msg=key)


def _quantize(w: np.ndarray, block: tuple[int, int]):
    """FP8 e4m3 with one float32 inverse scale per block of the last two dims."""
    rows, cols = w.shape[-2:]
    br, bc = block
    nr, nc = -(-rows // br), -(-cols // bc)
    padded = np.zeros(w.shape[:-2] + (nr * br, nc * bc), np.float32)
    padded[..., :rows, :cols] = w
    tiles = padded.reshape(w.shape[:-2] + (nr, br, nc, bc))
    amax = np.abs(tiles).max(axis=(-3, -1))
    scale_inv = np.where(amax > 0, amax / 448.0, 1.0).astype(np.float32)  # e4m3 max is 448
    q = (tiles / scale_inv[..., :, None, :, None]).reshape(padded.shape)[..., :rows, :cols]
    q = q.astype(ml_dtypes.float8_e4m3fn)
    deq = q.astype(np.float32) * np.repeat(np.repeat(scale_inv, br, -2), bc, -1)[
        ..., :rows, :cols]
    return q, scale_inv, deq


@pytest.mark.parametrize("layout", ["hub", "fused"])
@pytest.mark.parametrize("block", [None, (16, 8)], ids=["128x128", "16x8"])
def test_fp8_checkpoint_dequantised(layout, block):
    """Every ``*.weight`` of the experts and shared experts stored as FP8 with block scales
    (sizes not multiples of the block): loads equal to the float32 dequantised checkpoint."""
    cfg = dict(CONFIGS["deepseek_v3"], hidden_size=136, moe_intermediate_size=40)
    if block is not None:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                      "weight_block_size": list(block)}
    sd = _random_fused(cfg, seed=5)
    if layout == "hub":
        sd = _to_hub(sd, "deepseek_v3")
    quantized, dequantized = {}, dict(sd)
    for key, value in sd.items():
        if key.startswith(("experts.", "shared_experts.")):
            q, scale, deq = _quantize(value, block or (128, 128))
            scale_key = (key[: -len("weight")] + "weight_scale_inv" if key.endswith(".weight")
                         else key + "_scale_inv")
            quantized[key], quantized[scale_key], dequantized[key] = q, scale, deq
        else:
            quantized[key] = value
    params = hf.from_hf(quantized, cfg)
    assert params.w_gate_up.dtype == jnp.bfloat16  # FP8 loads into bfloat16 by default
    exact = hf.from_hf(quantized, cfg, dtype=jnp.float32)
    want = hf.from_hf(dequantized, cfg, dtype=jnp.float32)
    for name in ("w_gate_up", "w_down", "shared_gate_up", "shared_down", "router"):
        np.testing.assert_array_equal(getattr(exact, name), getattr(want, name), err_msg=name)
    assert testing.rel_error(params.w_down, want.w_down) < 4e-3  # bf16 rounding: 2^-8


def test_config_mapping():
    c = hf.config_from_hf(CONFIGS["deepseek_v3"])
    assert (c.routing, c.n_group, c.topk_group, c.routed_scaling_factor) == ("sigmoid", 4, 2, 2.5)
    assert c.num_shared_experts == 2 and c.shared_size == 32
    c = hf.config_from_hf(CONFIGS["qwen2_moe"])
    assert c.shared_expert_gate and c.shared_size == 24 and not c.norm_topk_prob
    assert hf.config_from_hf(CONFIGS["mixtral"]).norm_topk_prob
    no_groups = dict(CONFIGS["deepseek_v3"], n_group=None)
    assert hf.config_from_hf(no_groups).n_group is None


@pytest.mark.parametrize("change,match", [
    (dict(model_type="llama"), "model_type must be one of"),
    (dict(hidden_act="gelu"), r"hidden_act='gelu' cannot be represented"),
    (dict(topk_method="greedy"), r"topk_method='greedy' cannot be represented"),
    (dict(scoring_func="softmax"), r"scoring_func='softmax' cannot be represented"),
    (dict(topk_group=5), "invalid MoEConfig.*topk_group=5 must be <= n_group=4"),
])
def test_config_errors(change, match):
    with pytest.raises(ValueError, match=match):
        hf.config_from_hf(dict(CONFIGS["deepseek_v3"], **change))


def test_config_errors_other_models():
    with pytest.raises(ValueError, match="router_jitter_noise=0.1 cannot be represented"):
        hf.config_from_hf(dict(CONFIGS["mixtral"], router_jitter_noise=0.1))
    with pytest.raises(ValueError, match="hf_config has no field 'num_experts'"):
        hf.config_from_hf({k: v for k, v in CONFIGS["qwen3_moe"].items() if k != "num_experts"})


def test_state_dict_errors():
    cfg = CONFIGS["qwen2_moe"]
    sd = _to_hub(_random_fused(cfg, seed=1), "qwen2_moe")
    with pytest.raises(KeyError, match="neither p.experts.gate_up_proj"):
        hf.from_hf(sd, cfg, prefix="p")
    with pytest.raises(KeyError, match=r"no 'experts.5.up_proj.weight' \(expected shape"):
        hf.from_hf({k: v for k, v in sd.items() if k != "experts.5.up_proj.weight"}, cfg)
    with pytest.raises(ValueError, match=r"'gate.weight'\] must have shape \(6, 32\), got"):
        hf.from_hf(dict(sd, **{"gate.weight": sd["gate.weight"].T}), cfg)
    with pytest.raises(ValueError, match="does not have: \\['experts.0.gate_proj.bias'\\]"):
        hf.from_hf(dict(sd, **{"experts.0.gate_proj.bias": np.ones(8)}), cfg)
    with pytest.raises(ValueError, match="is float8_e4m3fn but has no"):
        hf.from_hf(dict(sd, **{"gate.weight": sd["gate.weight"].astype(
            ml_dtypes.float8_e4m3fn)}), cfg)
    ds = CONFIGS["deepseek_v3"]
    ds_sd = _random_fused(ds, seed=2)
    del ds_sd["gate.e_score_correction_bias"]
    with pytest.raises(KeyError, match="no 'gate.e_score_correction_bias'"):
        hf.from_hf(ds_sd, ds)
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        hf.from_hf(list(sd.items()), cfg)
    # Names outside the prefix (the rest of a model) are ignored.
    params = hf.from_hf({**{"mlp." + k: v for k, v in sd.items()}, "lm_head.weight": 0}, cfg,
                        prefix="mlp.")
    with pytest.raises(ValueError, match="layout must be one of"):
        hf.to_hf(params, cfg, layout="packed")
    with pytest.raises(ValueError, match=r"params.config.num_experts=6 but hf_config gives 8"):
        hf.to_hf(params, dict(cfg, num_experts=8))
