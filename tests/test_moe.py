"""jax_mok.moe on the CPU FFI kernels against the pure-JAX reference: values and gradients."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mok
from jax_mok import reference, testing
from jax_mok.kernels import autodiff, targets
from jax_mok.tuning import KernelTuning

F32, BF16 = jnp.float32, jnp.bfloat16


def _inputs(seed, config, tokens, dtype, lead=None):
    key = jax.random.key(seed)
    params = testing.random_params(jax.random.fold_in(key, 1), config, dtype)
    shape = (lead or (tokens,)) + (config.hidden_size,)
    x = jax.random.normal(jax.random.fold_in(key, 2), shape, F32).astype(dtype)
    return x, params


def _loss_fn(impl, cotangent):
    def loss(x, params):
        y = jax_mok.moe(x, params, implementation=impl)
        return jnp.sum(y.astype(F32) * cotangent)
    return loss


def _cotangent_loss(x, params, cotangent, impl):
    return _loss_fn(impl, cotangent)(x, params)


# One jitted gradient for every case, the cotangent an argument: the float32 reference of a
# bfloat16 case has the shapes of the float32 case's, so it reuses that compiled program.
_GRADS = jax.jit(jax.grad(_cotangent_loss, argnums=(0, 1)), static_argnums=3)


def _check_values_and_grads(x, params, dtype):
    """Kernel (x.dtype) vs reference on float32-upcast inputs, values and every gradient."""
    tol = testing.tolerance(dtype)
    cot = jax.random.normal(jax.random.key(99), x.shape, F32)
    y = jax.jit(lambda x, p: jax_mok.moe(x, p, implementation="ffi"))(x, params)
    y_ref = jax.jit(reference.moe)(testing.upcast(x), testing.upcast(params))
    assert y.shape == x.shape and y.dtype == x.dtype
    assert np.isfinite(np.asarray(y, np.float32)).all()
    assert testing.rel_error(y, y_ref) <= tol, testing.rel_error(y, y_ref)

    grads = _GRADS(x, params, cot, "ffi")
    grads_ref = _GRADS(testing.upcast(x), testing.upcast(params), cot, "reference")
    names = ["x"] + [f"params.{f.name}" for f in dataclasses.fields(params) if f.name != "config"]
    got_leaves = [grads[0]] + [getattr(grads[1], n.split(".")[1]) for n in names[1:]]
    ref_leaves = [grads_ref[0]] + [getattr(grads_ref[1], n.split(".")[1]) for n in names[1:]]
    for name, got, want in zip(names, got_leaves, ref_leaves, strict=True):
        if want is None:
            assert got is None
            continue
        assert got.shape == want.shape, name
        if name == "params.router_bias":  # selection only: no gradient by design
            assert not np.any(np.asarray(got)), name
            continue
        tol = testing.tolerance(dtype, router_grad=name == "params.router")
        err = testing.rel_error(got, want)
        assert err <= tol, f"d{name}: rel error {err:.2e} > {tol:.0e}"


CASES = [
    # (tokens, experts, top_k, hidden, ffn)
    (1, 4, 2, 40, 24),
    (7, 8, 2, 40, 24),
    (64, 8, 2, 40, 24),
    (257, 8, 2, 40, 24),
    (64, 1, 1, 40, 24),
    (64, 4, 1, 36, 20),   # H, F not multiples of 8
    (64, 4, 4, 40, 24),   # k = E
    (64, 64, 1, 40, 24),  # most experts get 0-2 tokens
    (64, 64, 2, 40, 24),
    (7, 64, 64, 24, 8),   # k = E = 64
    (257, 4, 2, 72, 56),
]


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("tokens,experts,top_k,hidden,ffn", CASES)
def test_matches_reference(tokens, experts, top_k, hidden, ffn, dtype):
    # With k = 1 and normalised weights every weight is 1 and the router gets no gradient; use
    # unnormalised weights there so that the router's gradient is checked too.
    config = jax_mok.MoEConfig(num_experts=experts, top_k=top_k, hidden_size=hidden,
                               ffn_size=ffn, norm_topk_prob=top_k > 1)
    x, params = _inputs(tokens * 131 + experts, config, tokens, dtype)
    _check_values_and_grads(x, params, dtype)


ROUTING_OPTIONS = {
    "sigmoid_bias": dict(routing="sigmoid"),
    "sigmoid_groups": dict(routing="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5),
    "softmax_groups": dict(n_group=2, topk_group=1),
    "no_norm": dict(norm_topk_prob=False),
    "scaled": dict(routed_scaling_factor=0.5),
    "shared": dict(num_shared_experts=2, shared_ffn_size=16),
    "shared_gated": dict(num_shared_experts=1, shared_expert_gate=True),
    "capacity": dict(capacity_factor=0.5),
}


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("option", sorted(ROUTING_OPTIONS))
def test_routing_options_match_reference(option, dtype):
    config = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=32, ffn_size=24,
                               **ROUTING_OPTIONS[option])
    x, params = _inputs(7, config, 0, dtype, lead=(3, 21))
    _check_values_and_grads(x, params, dtype)


def _direct(x, ids, weights, wgu, wd, impl):
    return autodiff.routed_experts(x, ids, weights, wgu, wd, implementation=impl)


@pytest.mark.parametrize("pattern", ["all_on_one", "zero_token_experts", "dropped"])
def test_routed_experts_edge_cases(pattern):
    T, E, k, H, F = 33, 6, 2, 24, 16
    key = jax.random.key(3)
    x = jax.random.normal(key, (T, H))
    wgu = jax.random.normal(jax.random.fold_in(key, 1), (E, H, 2 * F)) / 5
    wd = jax.random.normal(jax.random.fold_in(key, 2), (E, F, H)) / 4
    weights = jax.random.uniform(jax.random.fold_in(key, 3), (T, k))
    if pattern == "all_on_one":
        ids = jnp.stack([jnp.full((T,), 4), jnp.full((T,), 1)], 1)
    elif pattern == "zero_token_experts":
        ids = jnp.stack([jnp.arange(T) % 2, 2 + jnp.arange(T) % 2], 1)  # experts 4, 5 idle
    else:
        ids = jnp.stack([jnp.arange(T) % E, jnp.where(jnp.arange(T) % 3 == 0, -1, 5)], 1)
    ids = ids.astype(jnp.int32)
    args = (x, ids, weights, wgu, wd)
    y = _direct(*args, "ffi")  # the kernels eagerly; the reference oracle jitted (one compile
    # instead of ~70 op-by-op ones)
    assert testing.rel_error(y, jax.jit(_direct, static_argnums=5)(*args, "reference")) <= 1e-5

    def grads(impl):
        grad = jax.grad(lambda x, w, a, b: jnp.sum(_direct(x, ids, w, a, b, impl) ** 2),
                        argnums=(0, 1, 2, 3))
        return (jax.jit(grad) if impl == "reference" else grad)(x, weights, wgu, wd)

    ffi_grads = grads("ffi")
    for got, want in zip(ffi_grads, grads("reference"), strict=True):
        assert testing.rel_error(got, want) <= 1e-5
    d_w, d_gu, d_down = ffi_grads[1:]
    idle = sorted(set(range(E)) - set(np.asarray(ids).ravel().tolist()))
    for e in idle:  # an expert without tokens gets exactly zero gradient (written, not garbage)
        assert not np.any(np.asarray(d_gu[e])) and not np.any(np.asarray(d_down[e]))
    assert not np.any(np.asarray(d_w)[np.asarray(ids) < 0])  # skipped slots: zero gradient


def test_deterministic():
    config = jax_mok.MoEConfig(num_experts=8, top_k=3, hidden_size=64, ffn_size=48)
    x, params = _inputs(5, config, 300, BF16)
    f = jax.jit(jax.value_and_grad(lambda x, p: jnp.sum(jax_mok.moe(x, p).astype(F32) ** 2),
                                   argnums=(0, 1)))
    first, second = f(x, params), f(x, params)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_nan_propagates():
    config = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8)
    x, params = _inputs(2, config, 10, F32)
    x = x.at[3, 5].set(jnp.nan)
    y = np.asarray(jax_mok.moe(x, params))
    assert np.isnan(y[3]).all()
    assert np.isfinite(np.delete(y, 3, axis=0)).all()


def test_jit_checkpoint_scan_over_layers():
    config = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=24, ffn_size=16)
    layers = [testing.random_params(jax.random.key(i), config, F32) for i in range(3)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *layers)
    x = jax.random.normal(jax.random.key(9), (2, 5, 24))

    def net(x, stacked, impl):
        def body(h, p):
            layer = jax.checkpoint(lambda h, p: jax_mok.moe(h, p, implementation=impl))
            return h + layer(h, p), None
        return jnp.sum(jax.lax.scan(body, x, stacked)[0] ** 2)

    got = jax.jit(jax.value_and_grad(net, argnums=(0, 1)), static_argnums=2)(x, stacked, "ffi")
    # The reference oracle jitted too (one compile, not an op-by-op dispatch of the scan).
    want = jax.jit(jax.value_and_grad(net, argnums=(0, 1)), static_argnums=2)(x, stacked,
                                                                               "reference")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert testing.rel_error(a, b) <= 1e-4


def test_vmap_forward_works_and_backward_says_why():
    config = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8)
    x, params = _inputs(4, config, 0, F32, lead=(3, 5))
    batched = jax.vmap(lambda x: jax_mok.moe(x, params))(x)
    assert testing.rel_error(batched, jax.jit(reference.moe)(x, params)) <= 1e-5
    with pytest.raises(NotImplementedError, match="fold the vmapped axis"):
        jax.grad(lambda x: jax.vmap(lambda x: jax_mok.moe(x, params))(x).sum())(x)


def test_handler_error_becomes_python_exception():
    # Bypass the Python checks: the C++ handler must reject the mismatch with an ffi::Error.
    x = jnp.ones((4, 8))
    ids = jnp.zeros((4, 2), jnp.int32)
    weights = jnp.ones((4, 2))
    wgu = jnp.ones((2, 9, 6))  # H=9 does not match x's H=8
    wd = jnp.ones((2, 3, 8))
    with pytest.raises(Exception, match="w_gate_up must be"):
        jax.block_until_ready(targets.moe_forward(KernelTuning())(x, ids, weights, wgu, wd))


def test_input_dtypes_mixed_params_are_cast():
    config = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8)
    x, params = _inputs(4, config, 9, BF16)
    params32 = testing.upcast(params)  # f32 weights with bf16 x: computed in bf16
    y = jax_mok.moe(x, params32)
    assert y.dtype == BF16
    assert testing.rel_error(y, jax.jit(reference.moe)(testing.upcast(x), params32)) <= 1e-2


def test_padded_oracle_matches_reference():
    # reference.routed_experts_padded is the CPU oracle of `python -m jax_mok bench` and peer B2.
    x, ids, w, wgu, wd = testing.random_inputs(
        jax.random.key(11), testing.Shape("t", "t", 77, 24, 16, 6, 2), F32)
    ids = ids.at[3, 1].set(-1)
    capacity = int(np.bincount(np.asarray(ids)[np.asarray(ids) >= 0]).max())

    def grads(fn):  # jitted: one compile instead of an op-by-op dispatch of each oracle
        return jax.jit(jax.value_and_grad(lambda *z: jnp.sum(fn(z[0], ids, *z[1:]) ** 2),
                                          argnums=(0, 1, 2, 3)))(x, w, wgu, wd)

    padded = grads(lambda *a: reference.routed_experts_padded(*a, capacity))
    for got, want in zip(jax.tree.leaves(padded), jax.tree.leaves(grads(reference.routed_experts)),
                         strict=True):
        assert testing.rel_error(got, want) <= 1e-5


def test_save_activations_policy():
    """Saved pre-activations need the CUDA targets: the CPU backend refuses them by name, and
    the default there is to recompute."""
    assert autodiff.resolve_save_activations("cpu", None) is False
    assert autodiff.resolve_save_activations("cuda", None) is True
    assert autodiff.resolve_save_activations("cuda", False) is False
    with pytest.raises(ValueError, match="save_activations=True needs the CUDA kernels"):
        autodiff.resolve_save_activations("cpu", True)
    # platform-dependent at lowering
    assert autodiff.resolve_save_activations("ffi", True) is True


def test_save_activations_ffi_on_cpu_recomputes():
    """implementation="ffi" with saving on (a GPU machine's default) that lands on the CPU: the
    plain CPU targets run (h is a placeholder, the backward recomputes) and the values and
    gradients equal the recompute policy's."""
    config = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8)
    x, params = _inputs(3, config, 24, F32)
    from jax_mok.routing import route

    routing, _ = route(x, params.router, params.router_bias, config)
    args = (x, routing.topk_ids, routing.topk_weights, params.w_gate_up, params.w_down)

    def loss(save):
        def f(x, w, a, b):
            y = autodiff.routed_experts(x, args[1], w, a, b, implementation="ffi",
                                        save_activations=save)
            return jnp.sum(y * y)
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))

    saved = jax.tree.leaves(loss(True)(x, *args[2:]))
    recomputed = jax.tree.leaves(loss(False)(x, *args[2:]))
    for a, b in zip(saved, recomputed, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
