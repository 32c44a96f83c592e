"""Flax modules (jax_mok.nnx.MoE, jax_mok.linen.MoE) against the functional jax_mok.moe.

Values and gradients equal the op's on the same weights, the modules work inside scan over
layers and under remat, the sigmoid router bias is state (not trained) and balancing moves it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

flax = pytest.importorskip("flax")
import flax.linen as nn  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

import jax_mok  # noqa: E402
import jax_mok.linen  # noqa: E402
import jax_mok.nnx  # noqa: E402
from jax_mok import testing  # noqa: E402

CONFIG = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8,
                           routing="sigmoid", num_shared_experts=1)
TOL = testing.tolerance(jnp.float32)


def _x(shape=(2, 6, 16)):
    return jax.random.normal(jax.random.key(3), shape, jnp.float32)


def _functional_loss(params, x):
    y, aux = jax_mok.moe(x, params, return_aux=True)
    return jnp.sum(y ** 2) + aux["load_balancing_loss"]


def test_nnx_parity_values_and_grads():
    layer = jax_mok.nnx.MoE(CONFIG, rngs=nnx.Rngs(0))
    x = _x()
    params = layer.to_params()
    assert params.router_bias.shape == (4,) and params.shared_gate_up.shape == (16, 16)

    def loss(model, x):
        y, aux = model(x, return_aux=True)
        return jnp.sum(y ** 2) + aux["load_balancing_loss"]

    got, grads = nnx.jit(nnx.value_and_grad(loss))(layer, x)
    want, want_grads = jax.jit(jax.value_and_grad(_functional_loss))(params, x)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for name in ("router", "w_gate_up", "w_down", "shared_gate_up", "shared_down"):
        assert testing.rel_error(grads[name].get_value(), getattr(want_grads, name)) < TOL, name
    # nnx.grad differentiates Params only: the bias is not a parameter.
    assert "router_bias" not in grads
    assert isinstance(layer.router_bias, jax_mok.nnx.RouterBias)


def test_nnx_sharding_names_and_dtypes():
    layer = jax_mok.nnx.MoE(CONFIG, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16,
                            rngs=nnx.Rngs(0))
    specs = nnx.get_partition_spec(nnx.state(layer, nnx.Param))
    assert tuple(specs["w_gate_up"].get_value()) == ("expert", "embed", "mlp")
    assert tuple(specs["w_down"].get_value()) == ("expert", "mlp", "embed")
    assert tuple(specs["router"].get_value()) == ("embed", None)
    assert layer.w_gate_up.get_value().dtype == jnp.bfloat16
    assert layer.router.get_value().dtype == jnp.float32
    y = layer(_x())
    assert y.dtype == jnp.bfloat16 and y.shape == (2, 6, 16)


def test_nnx_injectable_op_and_sow():
    calls = []

    def op(x, params, return_aux=False):
        calls.append(x.shape)
        return jax_mok.moe(x, params, return_aux=return_aux, implementation="reference")

    layer = jax_mok.nnx.MoE(CONFIG, rngs=nnx.Rngs(1), moe_fn=op)
    x = _x()
    y = layer(x)
    want = jax_mok.moe(x, layer.to_params())
    assert calls == [(2, 6, 16)]
    assert testing.rel_error(y, want) < TOL
    sown = layer.aux.get_value()
    assert int(sown["expert_counts"].sum()) == 2 * 6 * 2


def test_modules_pass_their_tuning_to_the_op():
    """``tuning=`` of both modules reaches every call of the op (as ``tuning=``), and the default
    op computes the same values with it; a wrong type is refused by name."""
    tuned = jax_mok.Tuning(kernel=jax_mok.KernelTuning(gemm="simt"))
    seen = []

    def op(x, params, return_aux=False, **kw):
        seen.append(kw.get("tuning"))
        return jax_mok.moe(x, params, return_aux=return_aux, **kw)

    x = _x()
    layer = jax_mok.nnx.MoE(CONFIG, rngs=nnx.Rngs(1), moe_fn=op, tuning=tuned)
    want = jax_mok.moe(x, layer.to_params())
    assert testing.rel_error(layer(x), want) < TOL
    module = jax_mok.linen.MoE(CONFIG, moe_fn=op, tuning=tuned)
    variables = module.init(jax.random.key(0), x)
    module.apply(variables, x, mutable=["intermediates"])
    assert seen and all(t is tuned for t in seen), seen
    plain = jax_mok.nnx.MoE(CONFIG, rngs=nnx.Rngs(1), tuning=tuned)
    assert testing.rel_error(plain(x), want) < TOL
    with pytest.raises(TypeError, match="tuning must be a jax_mok.Tuning or None"):
        jax_mok.nnx.MoE(CONFIG, rngs=nnx.Rngs(1), tuning={"gemm": "simt"})


def test_nnx_scan_over_layers_with_remat():
    layers = 3
    config = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8,
                               routing="sigmoid")

    @nnx.split_rngs(splits=layers)
    @nnx.vmap(in_axes=0, out_axes=0)
    def create(rngs):
        return jax_mok.nnx.MoE(config, rngs=rngs, sow_aux=False)

    stack = create(nnx.Rngs(0))
    assert stack.w_gate_up.get_value().shape == (layers, 4, 16, 16)
    assert stack.router_bias.get_value().shape == (layers, 4)

    @nnx.remat
    def block(layer, h):
        y, aux = layer(h, return_aux=True)
        return h + y, aux["expert_counts"]

    def forward(stack, x):
        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=(nnx.Carry, 0))
        def body(layer, h):
            h, counts = block(layer, h)
            return h, counts

        return body(stack, x)

    def loss(stack, x):
        h, counts = forward(stack, x)
        return jnp.sum(h ** 2), counts

    x = _x()
    (value, counts), grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(stack, x)
    assert counts.shape == (layers, 4)

    # The same computation written out layer by layer with the functional op.
    state = nnx.state(stack)

    def unrolled(weights, x):
        h = x
        for i in range(layers):
            params = jax_mok.MoEParams(
                router=weights["router"][i], router_bias=state["router_bias"].get_value()[i],
                w_gate_up=weights["w_gate_up"][i], w_down=weights["w_down"][i],
                shared_gate_up=None, shared_down=None, config=config)
            h = h + jax_mok.moe(h, params)
        return jnp.sum(h ** 2)

    weights = {k: state[k].get_value() for k in ("router", "w_gate_up", "w_down")}
    want, want_grads = jax.jit(jax.value_and_grad(unrolled))(weights, x)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    for name in weights:
        assert testing.rel_error(grads[name].get_value(), want_grads[name]) < TOL, name

    # Balancing the stacked biases, one layer per row.
    before = stack.router_bias.get_value()
    jax_mok.nnx.update_router_bias(stack, counts, rate=0.25)
    delta = stack.router_bias.get_value() - before
    mean = counts.astype(jnp.float32).mean(-1, keepdims=True)
    np.testing.assert_allclose(delta, 0.25 * jnp.sign(mean - counts))


def test_nnx_bias_update_and_optimizer_skips_bias():
    layer = jax_mok.nnx.MoE(CONFIG, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(layer, optax.sgd(0.1), wrt=nnx.Param)
    x = _x()

    @nnx.jit
    def step(layer, optimizer, x):
        grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)
        optimizer.update(layer, grads)

    step(layer, optimizer, x)
    np.testing.assert_array_equal(layer.router_bias.get_value(), jnp.zeros(4))
    layer(x)
    counts = layer.aux.get_value()["expert_counts"]
    jax_mok.nnx.update_router_bias(layer, rate=0.5)
    want = 0.5 * jnp.sign(counts.mean() - counts.astype(jnp.float32))
    np.testing.assert_allclose(layer.router_bias.get_value(), want)
    with pytest.raises(ValueError, match="expected \\(4,\\)"):
        jax_mok.nnx.update_router_bias(layer, jnp.ones(3))


def test_linen_parity_values_and_grads_and_bias_collection():
    layer = jax_mok.linen.MoE(CONFIG)
    x = _x()
    variables = layer.init(jax.random.key(0), x)
    assert set(variables) == {"params", "router_bias"}
    specs = nn.get_partition_spec(variables)["params"]
    assert tuple(specs["w_gate_up"]) == ("expert", "embed", "mlp")
    unboxed = nn.unbox(variables)
    p = unboxed["params"]
    params = jax_mok.MoEParams(p["router"], unboxed["router_bias"]["bias"], p["w_gate_up"],
                               p["w_down"], p["shared_gate_up"], p["shared_down"], CONFIG)

    def loss(p, x):
        (y, aux), state = layer.apply({**unboxed, "params": p}, x, return_aux=True,
                                      mutable=["intermediates"])
        return jnp.sum(y ** 2) + aux["load_balancing_loss"], state

    (got, state), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(p, x)
    want, want_grads = jax.jit(jax.value_and_grad(_functional_loss))(params, x)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for name in ("router", "w_gate_up", "w_down", "shared_gate_up", "shared_down"):
        assert testing.rel_error(grads[name], getattr(want_grads, name)) < TOL, name
    counts = state["intermediates"]["aux"][0]["expert_counts"]
    new = jax_mok.linen.update_router_bias(unboxed, counts, rate=0.5)
    want_bias = 0.5 * jnp.sign(counts.mean() - counts.astype(jnp.float32))
    np.testing.assert_allclose(new["router_bias"]["bias"], want_bias)


def test_linen_scan_and_remat():
    layers = 2
    config = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            return h + jax_mok.linen.MoE(config, sow_aux=False)(h), None

    Stack = nn.scan(nn.remat(Block), variable_axes={"params": 0},
                    split_rngs={"params": True}, length=layers,
                    metadata_params={nn.PARTITION_NAME: None})
    x = _x()
    variables = Stack().init(jax.random.key(0), x, None)
    p = nn.unbox(variables)["params"]
    assert p["MoE_0"]["w_gate_up"].shape == (layers, 4, 16, 16)

    def loss(p):
        h, _ = Stack().apply({"params": p}, x, None)
        return jnp.sum(h ** 2)

    value, grads = jax.jit(jax.value_and_grad(loss))(p)

    def unrolled(p):
        h = x
        for i in range(layers):
            layer = jax.tree.map(lambda a, i=i: a[i], p["MoE_0"])
            params = jax_mok.MoEParams(layer["router"], None, layer["w_gate_up"],
                                       layer["w_down"], None, None, config)
            h = h + jax_mok.moe(h, params)
        return jnp.sum(h ** 2)

    want, want_grads = jax.jit(jax.value_and_grad(unrolled))(p)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        assert testing.rel_error(a, b) < TOL


def test_doctests():
    import doctest

    import jax_mok.balancing

    for module in (jax_mok.nnx, jax_mok.linen, jax_mok.balancing):
        result = doctest.testmod(module)
        assert result.failed == 0, f"{module.__name__}: {result}"


def test_stacked_bias_update_sums_leading_microbatch_axis():
    """A stacked bias [L, E] with counts [B, L, E] (B microbatches): each layer is balanced on
    its load summed over B — also when B == L, where a per-row vmap would pair the wrong axes."""
    from jax_mok.balancing import router_bias_update

    bias = jnp.zeros((3, 4))
    counts = jnp.arange(36).reshape(3, 3, 4) % 5  # B = L = 3
    new = router_bias_update(bias, counts, rate=0.5)
    load = counts.sum(0).astype(jnp.float32)
    np.testing.assert_allclose(new, 0.5 * jnp.sign(load.mean(-1, keepdims=True) - load))
    with pytest.raises(ValueError, match="must end in router_bias's shape \\(3, 4\\)"):
        router_bias_update(bias, jnp.ones((4, 4)))
