"""Bad input gets a clear Python error naming the argument before any kernel runs."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import jax_mok

CFG = dict(num_experts=8, top_k=2, hidden_size=16, ffn_size=8)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(top_k=0), "top_k must be a positive int"),
        (dict(top_k=9), r"top_k must be in \[1, num_experts=8\], got 9"),
        (dict(num_experts=0), "num_experts must be a positive int"),
        (dict(hidden_size=2.5), "hidden_size must be a positive int"),
        (dict(routing="relu"), "routing must be one of"),
        (dict(n_group=3, topk_group=1), "num_experts=8 must be divisible by n_group=3"),
        (dict(n_group=4, topk_group=5), "topk_group=5 must be <= n_group=4"),
        (dict(n_group=4), "n_group and topk_group must be set together"),
        (dict(n_group=8, topk_group=1), "cannot supply top_k=2"),
        (dict(capacity_factor=0.0), "capacity_factor must be None"),
        (dict(shared_ffn_size=4), "num_shared_experts is 0"),
        (dict(num_shared_experts=-1), "num_shared_experts must be an int >= 0"),
        (dict(activation="gelu"), "activation must be one of"),
        (dict(routed_scaling_factor=float("nan")), "routed_scaling_factor must be finite"),
    ],
)
def test_config_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        jax_mok.MoEConfig(**{**CFG, **overrides})


@pytest.fixture
def params():
    return jax_mok.init_params(jax.random.key(0), jax_mok.MoEConfig(**CFG), dtype=jnp.float32)


def test_wrong_hidden_size(params):
    match = r"x must have shape \[..., hidden_size=16\], got \(4, 15\)"
    with pytest.raises(ValueError, match=match):
        jax_mok.moe(jnp.ones((4, 15)), params)


def test_non_float_x(params):
    with pytest.raises(TypeError, match="x must be a floating-point array, got dtype int32"):
        jax_mok.moe(jnp.ones((4, 16), jnp.int32), params)


@pytest.mark.parametrize(
    "field,shape,match",
    [
        ("w_gate_up", (8, 16, 10), r"params.w_gate_up must have shape \(8, 16, 16\)"),
        ("w_down", (8, 16, 8), r"params.w_down must have shape \(8, 8, 16\)"),
        ("router", (16, 7), r"params.router must have shape \(16, 8\)"),
    ],
)
def test_weight_shapes_disagree_with_config(params, field, shape, match):
    bad = dataclasses.replace(params, **{field: jnp.ones(shape)})
    with pytest.raises(ValueError, match=match):
        jax_mok.moe(jnp.ones((4, 16)), bad)


def test_bias_with_softmax_routing(params):
    bad = dataclasses.replace(params, router_bias=jnp.zeros((8,)))
    with pytest.raises(ValueError, match="router_bias is only used by routing='sigmoid'"):
        jax_mok.moe(jnp.ones((4, 16)), bad)


def test_unknown_implementation(params):
    with pytest.raises(ValueError, match="implementation must be None or one of"):
        jax_mok.moe(jnp.ones((4, 16)), params, implementation="triton")


def test_params_type_and_replace(params):
    with pytest.raises(TypeError, match="params must be a jax_mok.MoEParams"):
        jax_mok.moe(jnp.ones((4, 16)), {"router": params.router})
    replaced = dataclasses.replace(params, w_down=params.w_down * 2)
    assert replaced.config == params.config
    # softmax routing, no shared expert: router, w_gate_up, w_down are the only leaves
    assert [a.shape for a in jax.tree.leaves(replaced)] == [(16, 8), (8, 16, 16), (8, 8, 16)]


def test_kernel_limits_fall_back_or_raise(params):
    x16 = jnp.ones((4, 16), jnp.float16)
    with pytest.raises(ValueError, match="the kernels take float32 or bfloat16 x, got float16"):
        jax_mok.moe(x16, params, implementation="ffi")
    with pytest.warns(UserWarning, match="using implementation='reference' because"):
        y = jax_mok.moe(x16, params)  # default: falls back to the reference, says why once
    assert y.dtype == jnp.float16 and y.shape == (4, 16)
    cfg = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=36, ffn_size=20)
    assert "multiples of 8" in jax_mok.api.kernel_limits(jnp.bfloat16, cfg, "gpu")
    assert jax_mok.api.kernel_limits(jnp.bfloat16, cfg, "cpu") is None
