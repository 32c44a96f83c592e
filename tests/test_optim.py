"""jax_mok.optim.weight_decay_mask with optax.adamw: weight decay never moves router_bias."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jax_mok
import jax_mok.linen
import jax_mok.nnx
from jax_mok import testing
from jax_mok.optim import weight_decay_mask

CONFIG = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8,
                           routing="sigmoid", num_shared_experts=1)
# lr * weight_decay large enough that one decayed step moves every weight visibly; the gradient
# is zero below, so any change comes from the decay alone.
ADAMW = dict(learning_rate=0.1, weight_decay=0.5)


def _zero_grads(tree):
    return jax.tree.map(jnp.zeros_like, tree)


def _moved(before, after) -> bool:
    return not np.array_equal(np.asarray(before), np.asarray(after))


def test_moe_params_router_bias_not_decayed():
    params = testing.random_params(jax.random.key(0), CONFIG)  # router_bias nonzero
    tx = optax.adamw(**ADAMW, mask=weight_decay_mask)
    updates, _ = tx.update(_zero_grads(params), tx.init(params), params)
    new = optax.apply_updates(params, updates)
    np.testing.assert_array_equal(new.router_bias, params.router_bias)
    for name in ("router", "w_gate_up", "w_down", "shared_gate_up", "shared_down"):
        assert _moved(getattr(params, name), getattr(new, name)), name


def test_mask_options():
    params = testing.random_params(jax.random.key(0), CONFIG)
    mask = weight_decay_mask(params)
    assert mask.router_bias is False and mask.w_gate_up is True
    mask = weight_decay_mask(params, exclude=("shared_down",))
    assert mask.shared_down is False and mask.shared_gate_up is True
    tree = {"norm": {"scale": jnp.ones(16)}, "dense": {"kernel": jnp.ones((16, 16)),
                                                      "bias": jnp.ones(16)}}
    assert weight_decay_mask(tree) == {"norm": {"scale": True},
                                       "dense": {"kernel": True, "bias": True}}
    assert weight_decay_mask(tree, exclude_vectors=True) == {
        "norm": {"scale": False}, "dense": {"kernel": True, "bias": False}}
    with pytest.raises(TypeError, match="exclude must be a collection of names"):
        weight_decay_mask(tree, exclude="bias")


class _Block(nnx.Module):
    def __init__(self, rngs):
        self.norm = nnx.RMSNorm(CONFIG.hidden_size, rngs=rngs)
        self.moe = jax_mok.nnx.MoE(CONFIG, rngs=rngs)

    def __call__(self, x):
        return self.moe(self.norm(x))


@pytest.mark.parametrize("wrt", ["param", "variable"])
def test_nnx_optimizer(wrt):
    """Both with the usual ``wrt=nnx.Param`` (router_bias is not optimized at all) and with every
    variable handed to optax (the mask must keep the RouterBias out)."""
    model = _Block(nnx.Rngs(0))
    model.moe.router_bias.set_value(jnp.linspace(-1.0, 1.0, CONFIG.num_experts))
    bias = np.asarray(model.moe.router_bias.get_value())
    w = np.asarray(model.moe.w_gate_up.get_value())
    scale = np.asarray(model.norm.scale.get_value())
    tx = optax.adamw(**ADAMW, mask=functools.partial(weight_decay_mask, exclude_vectors=True))
    kind = nnx.Param if wrt == "param" else nnx.Variable
    opt = nnx.Optimizer(model, tx, wrt=kind)
    grads = _zero_grads(nnx.state(model, kind))
    opt.update(model, grads)
    np.testing.assert_array_equal(model.moe.router_bias.get_value(), bias)
    np.testing.assert_array_equal(model.norm.scale.get_value(), scale)  # a vector: excluded
    assert _moved(w, model.moe.w_gate_up.get_value())


def test_linen_variables():
    layer = jax_mok.linen.MoE(CONFIG)
    variables = layer.init(jax.random.key(0), jnp.ones((2, 3, CONFIG.hidden_size)))
    variables = {**variables, "router_bias": {"bias": jnp.linspace(-1.0, 1.0, 4)}}
    tx = optax.adamw(**ADAMW, mask=weight_decay_mask)
    # Everything (params and the router_bias collection) handed to the optimizer.
    updates, _ = tx.update(_zero_grads(variables), tx.init(variables), variables)
    new = optax.apply_updates(variables, updates)
    np.testing.assert_array_equal(new["router_bias"]["bias"], variables["router_bias"]["bias"])
    assert _moved(variables["params"]["w_down"].value, new["params"]["w_down"].value)
