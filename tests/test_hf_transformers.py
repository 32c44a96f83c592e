"""jax_mok.hf against transformers' own MoE blocks (torch, CPU): tiny random configs, the block's
state_dict (transformers-5 layout) and a saved checkpoint (the layout save_pretrained writes)
loaded with from_hf, outputs compared. Skipped where torch or transformers >= 5 is missing."""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mok import hf, moe, testing

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"needs transformers >= 5, found {transformers.__version__}",
                allow_module_level=True)

H, F = 32, 16


@pytest.fixture(autouse=True)
def _on_cpu():
    """float32 comparisons at 1e-5 need exact float32 GEMMs: run JAX on the CPU even where a GPU
    is the default (a GPU may use TF32 for float32 products)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


ATTENTION = dict(vocab_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                 intermediate_size=48, max_position_embeddings=64)
MODELS = {
    # model_type: (config class, block class path, MoE kwargs, extra kwargs for a whole model)
    "qwen3_moe": ("Qwen3MoeConfig", "qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
                  dict(hidden_size=H, moe_intermediate_size=F, num_experts=8,
                       num_experts_per_tok=2, norm_topk_prob=True), {}),
    "qwen2_moe": ("Qwen2MoeConfig", "qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
                  dict(hidden_size=H, moe_intermediate_size=F, shared_expert_intermediate_size=24,
                       num_experts=6, num_experts_per_tok=2, norm_topk_prob=False), {}),
    "mixtral": ("MixtralConfig", "mixtral.modeling_mixtral.MixtralSparseMoeBlock",
                dict(hidden_size=H, intermediate_size=F, num_local_experts=8,
                     num_experts_per_tok=2), {}),
    "deepseek_v3": ("DeepseekV3Config", "deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE",
                    dict(hidden_size=H, moe_intermediate_size=F, n_routed_experts=16,
                         num_experts_per_tok=4, n_group=4, topk_group=2,
                         routed_scaling_factor=2.5, norm_topk_prob=True, n_shared_experts=1),
                    dict(first_k_dense_replace=0, kv_lora_rank=16, q_lora_rank=16,
                         qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)),
}


def _config(kind, whole_model=False):
    cls_name, _, moe_kwargs, model_kwargs = MODELS[kind]
    kwargs = dict(moe_kwargs, **(dict(ATTENTION, **model_kwargs) if whole_model else {}))
    return getattr(transformers, cls_name)(**kwargs)


def _randomize(module, seed):
    """Random weights and buffers (transformers initialises some of them to zeros)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if tensor.is_floating_point():
                fan_in = tensor.shape[-1] if tensor.ndim > 1 else 1
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * fan_in**-0.5
                             * (0.3 if "bias" in name else 1.0))
    return module


def _block(kind, seed=0):
    path = MODELS[kind][1]
    module_path, cls_name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(f"transformers.models.{module_path}"), cls_name)
    return _randomize(cls(_config(kind)), seed).eval()


def _x(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((2, 9, H), generator=gen)


@pytest.mark.parametrize("as_dict", [False, True], ids=["config", "dict"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_block_matches_transformers(kind, as_dict):
    """float32 on both sides: 1e-5 relative covers the GEMMs' summation order."""
    block = _block(kind)
    config = _config(kind)
    hf_config = config.to_dict() if as_dict else config
    params = hf.from_hf(block.state_dict(), hf_config)
    x = _x()
    with torch.no_grad():
        want = block(x).numpy()
    got = moe(jnp.asarray(x.numpy()), params, implementation="reference")
    assert testing.rel_error(got, want) <= 1e-5
    back = hf.to_hf(params, hf_config, layout="fused")
    for key, value in block.state_dict().items():
        np.testing.assert_array_equal(back[key], value.numpy(), err_msg=key)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_saved_checkpoint_loads(kind, tmp_path):
    """A whole tiny model saved by save_pretrained (the layout transformers writes to disk)
    loads with from_hf and matches the model's layer-0 block."""
    from safetensors.numpy import load_file

    config = _config(kind, whole_model=True)
    model = _randomize(transformers.AutoModelForCausalLM.from_config(config), seed=2).eval()
    model.save_pretrained(tmp_path)
    state = {}
    for path in sorted(tmp_path.glob("*.safetensors")):
        state.update(load_file(str(path)))
    routers = [k for k in state if k.startswith("model.layers.0.") and k.endswith(".gate.weight")]
    assert len(routers) == 1, routers
    prefix = routers[0][: -len("gate.weight")]
    params = hf.from_hf(state, config, prefix=prefix)
    block = model.model.layers[0].mlp if hasattr(model.model.layers[0], "mlp") else \
        model.model.layers[0].block_sparse_moe
    x = _x(3)
    with torch.no_grad():
        want = block(x).numpy()
    got = moe(jnp.asarray(x.numpy()), params, implementation="reference")
    assert testing.rel_error(got, want) <= 1e-5


def test_torch_bfloat16_and_fp8_tensors():
    """torch bfloat16 / float8 tensors convert bit for bit (through ml_dtypes)."""
    block = _block("deepseek_v3")
    sd32 = block.state_dict()
    sd16 = {k: v.to(torch.bfloat16) if k != "gate.e_score_correction_bias" else v
            for k, v in sd32.items()}
    config = _config("deepseek_v3")
    p16, p32 = hf.from_hf(sd16, config), hf.from_hf(sd32, config)
    assert p16.w_gate_up.dtype == jnp.bfloat16
    np.testing.assert_array_equal(p16.w_gate_up, p32.w_gate_up.astype(jnp.bfloat16))
    # FP8 with unit scales: dequantised values are the float8 values themselves.
    fp8 = dict(sd32)
    fp8["experts.down_proj"] = sd32["experts.down_proj"].to(torch.float8_e4m3fn)
    fp8["experts.down_proj_scale_inv"] = torch.ones((16, 1, 1))
    p8 = hf.from_hf(fp8, config, dtype=jnp.float32)
    want = fp8["experts.down_proj"].to(torch.float32).numpy().transpose(0, 2, 1)
    np.testing.assert_array_equal(p8.w_down, want)
