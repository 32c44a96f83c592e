"""Layer features beyond the routed experts: the shared-expert gate, non-finite expert weights,
and zero tokens. Runs on the reference and on the CPU kernels."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mok
from jax_mok import reference, routing, testing
from jax_mok.kernels import _ffi

IMPLS = ["reference"] + (["cpu"] if _ffi.kernels_built("cpu") else [])
GATED = jax_mok.MoEConfig(num_experts=6, top_k=2, hidden_size=24, ffn_size=16,
                          num_shared_experts=2, shared_ffn_size=8, shared_expert_gate=True)


def _silu(v):
    return v / (1.0 + np.exp(-v))


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _numpy_shared(x, params):
    """(gated shared output [T, H], ungated shared output, gate sigmoid [T, 1]) in float64."""
    S = params.config.shared_size
    gu = np.asarray(params.shared_gate_up, np.float64)
    h = x @ gu
    mlp = (_silu(h[:, :S]) * h[:, S:]) @ np.asarray(params.shared_down, np.float64)
    s = _sigmoid(x @ np.asarray(params.shared_gate, np.float64))
    return s * mlp, mlp, s


def _numpy_routed(x, ids, weights, params):
    """Dense float64 routed experts: ``sum_j w_j SwiGLU_{ids_j}(x)``."""
    F = params.config.ffn_size
    wgu = np.asarray(params.w_gate_up, np.float64)
    wd = np.asarray(params.w_down, np.float64)
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, w in zip(ids[t], weights[t], strict=True):
            h = x[t] @ wgu[e]
            y[t] += w * ((_silu(h[:F]) * h[F:]) @ wd[e])
    return y


def _gated_inputs(seed):
    params = testing.random_params(jax.random.key(seed), GATED, jnp.float32)
    x = jax.random.normal(jax.random.key(seed + 1), (37, GATED.hidden_size), jnp.float32)
    return x, params


@pytest.mark.parametrize("impl", IMPLS)
def test_shared_expert_gate_values(impl):
    """y = routed + sigmoid(x @ shared_gate) * shared_mlp(x), against float64 NumPy (f32
    operands: 1e-5 relative covers the float32 GEMM rounding)."""
    x, params = _gated_inputs(3)
    y = jax.jit(lambda x, p: jax_mok.moe(x, p, implementation=impl))(x, params)
    r, _ = routing.route(x, params.router, params.router_bias, GATED)
    x64 = np.asarray(x, np.float64)
    want = _numpy_routed(x64, np.asarray(r.topk_ids), np.asarray(r.topk_weights, np.float64),
                         params) + _numpy_shared(x64, params)[0]
    assert testing.rel_error(y, want) <= 1e-5


@pytest.mark.parametrize("impl", IMPLS)
def test_shared_expert_gate_gradient(impl):
    """d shared_gate and the shared expert's part of d x against float64 NumPy (analytic
    backward of ``sigmoid(x @ g) * SwiGLU(x)``), float32 within 1e-5 relative."""
    x, params = _gated_inputs(5)
    cot = jax.random.normal(jax.random.key(11), x.shape, jnp.float32)

    def loss(x, p):
        return jnp.sum(jax_mok.moe(x, p, implementation=impl) * cot)

    dx, dp = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, params)
    routed_only = dataclasses.replace(
        params, shared_gate_up=None, shared_down=None, shared_gate=None,
        config=dataclasses.replace(GATED, num_shared_experts=0, shared_ffn_size=None,
                                   shared_expert_gate=False))
    dx_routed = jax.jit(jax.grad(loss))(x, routed_only)

    x64, cot64 = np.asarray(x, np.float64), np.asarray(cot, np.float64)
    S = GATED.shared_size
    gu = np.asarray(params.shared_gate_up, np.float64)
    down = np.asarray(params.shared_down, np.float64)
    gate = np.asarray(params.shared_gate, np.float64)
    _, mlp, s = _numpy_shared(x64, params)
    d_logit = (cot64 * mlp).sum(-1, keepdims=True) * s * (1 - s)  # [T, 1]
    assert testing.rel_error(dp.shared_gate, x64.T @ d_logit) <= 1e-5
    h = x64 @ gu
    g, u = h[:, :S], h[:, S:]
    da = (cot64 * s) @ down.T
    sig = _sigmoid(g)
    dg = da * u * (sig + g * sig * (1 - sig))  # silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g)))
    du = da * _silu(g)
    dx_shared = np.concatenate([dg, du], -1) @ gu.T + d_logit @ gate.T
    assert testing.rel_error(np.asarray(dx) - np.asarray(dx_routed), dx_shared) <= 1e-5


def test_shared_expert_gate_validation():
    x, params = _gated_inputs(1)
    with pytest.raises(ValueError, match=r"params.shared_gate is None but the config needs"):
        jax_mok.moe(x, dataclasses.replace(params, shared_gate=None))
    with pytest.raises(ValueError, match=r"shared_gate must have shape \(24, 1\)"):
        jax_mok.moe(x, dataclasses.replace(params, shared_gate=params.shared_gate.T))
    plain = dataclasses.replace(params, config=dataclasses.replace(GATED,
                                shared_expert_gate=False))
    with pytest.raises(ValueError, match="shared_gate is set but config.shared_expert_gate"):
        jax_mok.moe(x, plain)
    with pytest.raises(ValueError, match="num_shared_experts is 0"):
        jax_mok.MoEConfig(num_experts=4, top_k=1, hidden_size=8, ffn_size=8,
                          shared_expert_gate=True)
    with pytest.raises(ValueError, match="shared_expert_gate must be True or False"):
        dataclasses.replace(GATED, shared_expert_gate=1)


def test_shared_expert_gate_flax_modules():
    from flax import nnx

    import jax_mok.linen
    import jax_mok.nnx

    layer = jax_mok.nnx.MoE(GATED, rngs=nnx.Rngs(0))
    assert layer.shared_gate.shape == (GATED.hidden_size, 1)
    assert layer.to_params().shared_gate is not None
    x = jax.random.normal(jax.random.key(2), (3, 5, GATED.hidden_size))
    np.testing.assert_array_equal(layer(x), jax_mok.moe(x, layer.to_params()))
    variables = jax_mok.linen.MoE(GATED).init(jax.random.key(0), x)
    assert variables["params"]["shared_gate"].value.shape == (GATED.hidden_size, 1)


# --- non-finite expert weights ---------------------------------------------------------------

NAN_CONFIG = jax_mok.MoEConfig(num_experts=6, top_k=2, hidden_size=16, ffn_size=8)


@functools.cache
def _jitted(impl: str):
    """The layer and its d x for ``impl``, jitted once: the cases below differ in weight values
    only, so they share the compiled programs (one compile per impl, not per case)."""
    fn = jax.jit(lambda x, p: jax_mok.moe(x, p, implementation=impl))
    grad = jax.jit(jax.grad(lambda x, p: jnp.sum(jax_mok.moe(x, p, implementation=impl))))
    return fn, grad


def _poisoned(weight: str, value: float):
    params = testing.random_params(jax.random.key(7), NAN_CONFIG, jnp.float32)
    bad = getattr(params, weight).at[2, 3, 5].set(value)  # one entry of expert 2
    x = jax.random.normal(jax.random.key(8), (64, NAN_CONFIG.hidden_size), jnp.float32)
    r, _ = routing.route(x, params.router, None, NAN_CONFIG)
    users = np.asarray((r.topk_ids == 2).any(-1))
    assert 0 < users.sum() < len(users)  # the check below needs both kinds of token
    return x, params, dataclasses.replace(params, **{weight: bad}), users, r


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("weight", ["w_gate_up", "w_down"])
@pytest.mark.parametrize("impl", IMPLS)
def test_nonfinite_expert_reaches_only_its_tokens(impl, weight, value):
    """A non-finite weight of expert 2: its tokens' outputs and d x are non-finite, every other
    token's are finite and bitwise what they were with clean weights."""
    x, clean, bad, users, _ = _poisoned(weight, value)
    fn, grad = _jitted(impl)
    y_bad, y_clean = np.asarray(fn(x, bad)), np.asarray(fn(x, clean))
    assert not np.isfinite(y_bad[users]).all(axis=-1).any()
    np.testing.assert_array_equal(y_bad[~users], y_clean[~users])
    g_bad, g_clean = np.asarray(grad(x, bad)), np.asarray(grad(x, clean))
    np.testing.assert_array_equal(g_bad[~users], g_clean[~users])
    assert not np.isfinite(g_bad[users]).all(axis=-1).any()


@pytest.mark.parametrize("weight", ["w_gate_up", "w_down"])
def test_nonfinite_expert_padded_einsum(weight):
    """The padded-einsum form: padding slots of the NaN expert turn NaN but are never read."""
    x, clean, bad, users, r = _poisoned(weight, np.nan)
    capacity = int(r.expert_counts.max()) + 5  # spare slots: padding rows exist in every expert

    @jax.jit  # one compile for both weights (and one for the gradient), not op-by-op
    def fn(x, p):
        return reference.routed_experts_padded(x, r.topk_ids, r.topk_weights, p.w_gate_up,
                                               p.w_down, capacity)

    y_bad, y_clean = np.asarray(fn(x, bad)), np.asarray(fn(x, clean))
    assert np.isnan(y_bad[users]).any(-1).all()
    np.testing.assert_array_equal(y_bad[~users], y_clean[~users])
    grad = jax.jit(jax.grad(lambda x, p: jnp.sum(fn(x, p))))
    g_bad = np.asarray(grad(x, bad))
    g_clean = np.asarray(grad(x, clean))
    np.testing.assert_array_equal(g_bad[~users], g_clean[~users])


def test_nonfinite_expert_weight_gradients_stay_in_the_expert():
    """Weight gradients of the other experts are finite on the reference path."""
    x, _, bad, _, _ = _poisoned("w_gate_up", np.nan)
    g = jax.jit(jax.grad(lambda p: jnp.nansum(jax_mok.moe(x, p, implementation="reference"))))(
        bad)
    for name in ("w_gate_up", "w_down"):
        finite = np.isfinite(np.asarray(getattr(g, name))).all(axis=(1, 2))
        assert finite.tolist() == [True, True, False, True, True, True], name


# --- zero tokens -----------------------------------------------------------------------------

@pytest.mark.parametrize("routing_kind", ["softmax", "sigmoid"])
@pytest.mark.parametrize("impl", IMPLS)
def test_zero_tokens_aux_losses_are_zero(impl, routing_kind):
    config = dataclasses.replace(GATED, routing=routing_kind)
    params = testing.random_params(jax.random.key(0), config, jnp.float32)
    x = jnp.zeros((2, 0, config.hidden_size), jnp.float32)
    y, aux = jax_mok.moe(x, params, return_aux=True, implementation=impl)
    assert y.shape == x.shape
    for name in ("load_balancing_loss", "router_z_loss", "dropped_tokens"):
        assert float(aux[name]) == 0.0, name
    assert not np.asarray(aux["expert_counts"]).any()

    def loss(p):
        _, aux = jax_mok.moe(x, p, return_aux=True, implementation=impl)
        return aux["load_balancing_loss"] + aux["router_z_loss"]

    g = jax.grad(loss)(params)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(g))
