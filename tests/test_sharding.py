"""Expert parallelism (jax_mok.sharding, transport "xla") on forced CPU devices.

Each case compares ``jax_mok.moe`` on a mesh against the single-device call: values, aux and the
gradients of x and every weight, within ``jax_mok.testing.tolerance``.

Needs 8 CPU devices: asked for here, at import (collection time, before any test has created the
CPU backend), unless ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` already does it. If a
module collected earlier created the backend first, the tests skip and say so.
"""

from __future__ import annotations

import dataclasses

import cpu_devices
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mok
from jax_mok import sharding, testing
from jax_mok.ep import pack
from jax_mok.kernels import _ffi

CPU_DEVICES = cpu_devices.CPU_DEVICES
cpu_devices.request()


def _mesh(data: int, ep: int, axis_type=AxisType.Explicit):
    return cpu_devices.mesh((data, ep), ("data", "expert"), axis_type)


def _loss(x, params, **kwargs):
    y, aux = jax_mok.moe(x, params, return_aux=True, **kwargs)
    loss = jnp.sum(y.astype(jnp.float32) ** 2) + aux["load_balancing_loss"] + 0.1 * aux[
        "router_z_loss"]
    return loss, (y, aux)


def _value_and_grad(x, params, **kwargs):
    fn = jax.value_and_grad(lambda x, p: _loss(x, p, **kwargs), argnums=(0, 1), has_aux=True)
    return jax.jit(fn)(x, params)


def _check_parity(config, data: int, ep: int, dtype=jnp.float32, tokens: int = 64):
    params = testing.random_params(jax.random.key(0), config, dtype)
    x = jax.random.normal(jax.random.key(1), (tokens // 8, 8, config.hidden_size)).astype(dtype)
    (_, (y0, aux0)), g0 = _value_and_grad(x, params)
    (_, (y1, aux1)), g1 = _value_and_grad(x, params, mesh=_mesh(data, ep))
    tol = testing.tolerance(dtype)
    assert y1.shape == y0.shape and y1.dtype == y0.dtype
    assert testing.rel_error(y1, y0) < tol
    np.testing.assert_array_equal(aux1["expert_counts"], aux0["expert_counts"])
    assert int(aux1["dropped_tokens"]) == int(aux0["dropped_tokens"])
    for name in ("load_balancing_loss", "router_z_loss"):
        np.testing.assert_allclose(aux1[name], aux0[name], rtol=1e-5)
    leaves0 = jax.tree_util.tree_leaves_with_path(g0)
    leaves1 = jax.tree.leaves(g1)
    for (path, want), got in zip(leaves0, leaves1, strict=True):
        err = testing.rel_error(got, want)
        assert err < tol, f"gradient {jax.tree_util.keystr(path)}: rel error {err} >= {tol}"
    return aux0


@pytest.mark.parametrize("data,ep", [(1, 2), (2, 2), (2, 4), (1, 8)])
def test_parity_dropless(data, ep):
    config = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=32, ffn_size=16,
                               num_shared_experts=1)
    _check_parity(config, data, ep)


def test_parity_shared_expert_gate():
    config = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=32, ffn_size=16,
                               num_shared_experts=1, shared_expert_gate=True)
    _check_parity(config, 2, 2)


def test_parity_capacity_drops_match():
    """Global capacity semantics: EP drops exactly the assignments the single call drops."""
    config = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=32, ffn_size=16,
                               capacity_factor=0.75)
    aux = _check_parity(config, 2, 4)
    assert int(aux["dropped_tokens"]) > 0


def test_parity_sigmoid_grouped_bf16_ep1():
    config = jax_mok.MoEConfig(num_experts=8, top_k=3, hidden_size=32, ffn_size=16,
                               routing="sigmoid", n_group=4, topk_group=2)
    _check_parity(config, 1, 1, jnp.bfloat16)


def _place(params, mesh):
    experts = NamedSharding(mesh, P("expert"))
    return dataclasses.replace(params, w_gate_up=jax.device_put(params.w_gate_up, experts),
                               w_down=jax.device_put(params.w_down, experts))


def test_ambient_mesh_no_expert_all_gather():
    """Under jax.set_mesh with NamedSharding-placed inputs the call is EP without being told,
    and the compiled program moves tokens (all-to-all) but never gathers the experts."""
    config = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=32, ffn_size=16)
    params = testing.random_params(jax.random.key(0), config)
    x = jax.random.normal(jax.random.key(1), (64, 32))
    want = jax.jit(jax_mok.moe)(x, params)
    for axis_type in (AxisType.Auto, AxisType.Explicit):
        mesh = _mesh(2, 4, axis_type)
        placed = _place(params, mesh)
        xs = jax.device_put(x, NamedSharding(mesh, P(("data", "expert"))))
        with jax.set_mesh(mesh):
            fn = jax.jit(jax_mok.moe)
            assert testing.rel_error(fn(xs, placed), want) < 1e-4
            hlo = fn.lower(xs, placed).compile().as_text()
        assert "all-to-all" in hlo
        assert "all-gather" not in hlo, f"{axis_type}: the experts were gathered"
        # Outside jit, concretely placed weights alone select EP.
        plan = sharding.plan_for(placed)
        assert plan is not None and plan.ep_size == 4 and plan.mesh == mesh


def test_ambient_mesh_resolves_to_the_concrete_mesh():
    """Under jax.set_mesh the plan holds the concrete Mesh, inside jit too (where JAX exposes only
    an AbstractMesh publicly), so that transport "auto" can check the devices for peer access
    instead of falling back for want of them."""
    config = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=32, ffn_size=16)
    params = testing.random_params(jax.random.key(0), config)
    x = jax.random.normal(jax.random.key(1), (64, 32))
    mesh = _mesh(2, 4)
    seen = []

    def f(x, p):
        seen.append(sharding.plan_for(p))
        return x

    with jax.set_mesh(mesh):
        jax.jit(f)(x, params)
        with sharding.expert_parallel() as plan:
            seen.append(plan)
    assert len(seen) == 2
    for plan in seen:
        assert isinstance(plan.mesh, jax.sharding.Mesh) and plan.mesh == mesh, plan.mesh
        assert plan.ep_size == 4


def test_context_manager_and_token_axes():
    config = jax_mok.MoEConfig(num_experts=4, top_k=1, hidden_size=16, ffn_size=8)
    params = testing.random_params(jax.random.key(0), config)
    x = jax.random.normal(jax.random.key(1), (2, 16, 16))
    want = jax.jit(jax_mok.moe)(x, params)
    mesh = _mesh(2, 4)
    with sharding.expert_parallel(mesh, token_axes=("expert",)) as plan:
        assert plan.ep_size == 4 and plan.token_shards == 4
        got = jax.jit(jax_mok.moe)(x, params)
    assert testing.rel_error(got, want) < 1e-4
    # A single axis may be named as a string, as for moe(..., token_axes=...).
    with sharding.expert_parallel(mesh, token_axes="expert") as plan:
        assert plan.token_axes == ("expert",)
        assert plan.transport == "auto"  # unnamed: JAX_MOK_TRANSPORT, unset here


def test_eager_calls_on_a_mesh_compile_once():
    """An eager call with a mesh runs jitted (the shard_map would otherwise dispatch op by op
    and compile every op again on each call: ~200 programs): the second call compiles nothing,
    and the value is the jitted call's."""
    from jax_mok import api

    config = jax_mok.MoEConfig(hidden_size=32, ffn_size=64, num_experts=8, top_k=2)
    params = testing.random_params(jax.random.key(0), config, jnp.float32)
    x = jax.random.normal(jax.random.key(1), (16, 32))
    mesh = _mesh(2, 4)
    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        first = jax_mok.moe(x, params, mesh=mesh)
        n_first = len(compiles)
        second = jax_mok.moe(x, params, mesh=mesh)
        n_second = len(compiles) - n_first
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert n_first > 0, "the listener saw no compilation: the check below would prove nothing"
    assert n_second == 0, f"the second eager call compiled {n_second} programs"
    assert api._jitted_expert_parallel.cache_info().hits >= 1
    jitted = jax.jit(lambda x, p: jax_mok.moe(x, p, mesh=mesh))(x, params)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(second))
    np.testing.assert_array_equal(np.asarray(first), np.asarray(jitted))


def test_errors_name_the_problem():
    config = jax_mok.MoEConfig(num_experts=6, top_k=2, hidden_size=16, ffn_size=8)
    params = testing.random_params(jax.random.key(0), config)
    x = jnp.ones((16, 16))
    mesh = _mesh(2, 4)
    with pytest.raises(ValueError, match=r"num_experts=6 must be divisible .* 'expert' \(4\)"):
        jax_mok.moe(x, params, mesh=mesh)
    with pytest.raises(ValueError, match=r"expert_axis='ep' is not an axis of the mesh"):
        jax_mok.moe(x, params, mesh=mesh, expert_axis="ep")
    with pytest.raises(ValueError, match=r"transport must be"):
        jax_mok.moe(x, params, mesh=mesh, transport="nccl")
    with pytest.raises(ValueError, match=r"transport='xla' needs a mesh"):
        jax_mok.moe(x, params, transport="xla")
    with pytest.raises(ValueError, match=r"must contain expert_axis"):
        jax_mok.moe(x, params, mesh=mesh, token_axes=("data",))
    config8 = dataclasses.replace(config, num_experts=8)
    params8 = testing.random_params(jax.random.key(0), config8)
    with pytest.raises(ValueError, match=r"12 tokens .* divisible by 8"):
        jax_mok.moe(jnp.ones((12, 16)), params8, mesh=mesh)
    bad = dataclasses.replace(params8, w_down=jax.device_put(
        params8.w_down, NamedSharding(mesh, P(None, "expert"))))
    with pytest.raises(ValueError, match=r"params.w_down is sharded as .* cannot use"):
        jax_mok.moe(x, bad, mesh=mesh)
    with pytest.raises(NotImplementedError, match=r"transport='peer'"):
        jax_mok.moe(x, params8, mesh=mesh, transport="peer")


@pytest.mark.parametrize("rows", [24, 5])  # 5: the buffer is smaller than the tokens sent
def test_pack_rows_transpose_is_a_fixed_order_gather(rows):
    """pack.pack_rows: the forward is the packing gather; its cotangent is the exact
    transpose (float32: equal to the autodiff of the plain gather, whose scatter-add has at most
    one term per destination here) and comes out the same on every call."""
    T, ep, k = 20, 3, 2
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(-1, 6, size=(T, k)), jnp.int32)  # -1: dropped slot
    _, sent, row, source_token, _ = pack.dispatch_indices(ids, ep, 2, rows)
    token_of_row = jnp.minimum(source_token, T - 1)
    padding = source_token >= T
    x = jnp.asarray(rng.standard_normal((T, 8)), jnp.float32)
    ct = jnp.asarray(rng.standard_normal((ep, rows, 8)), jnp.float32)

    def plain(v):
        return jnp.where(padding[:, :, None], 0.0, v[token_of_row])

    def packed(v):
        return pack.pack_rows(v, token_of_row, padding, row, sent)

    np.testing.assert_array_equal(packed(x), plain(x))
    got = jax.vjp(packed, x)[1](ct)[0]
    want = jax.vjp(plain, x)[1](ct)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert float(jnp.abs(got).sum()) > 0  # something flowed back
    again = jax.jit(lambda c: jax.vjp(packed, x)[1](c)[0])(ct)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(got))


@pytest.mark.parametrize("ep", [2, 3])
def testsum_home_rows_adds_in_ascending_destination_order(ep):
    """pack.sum_home_rows: bitwise the sequential float32 sum ((0 + b_0) + b_1) + ... over
    the destinations a token was sent to, the order of the peer combine kernel; bf16 inputs are
    widened before adding; clipped rows of unsent slots never count."""
    T, rows, H = 17, 9, 6
    rng = np.random.default_rng(ep)
    buffer = jnp.asarray(rng.standard_normal((ep, rows, H)) * 1e3, jnp.bfloat16)
    row = jnp.asarray(rng.integers(-1, rows + 2, size=(T, ep)), jnp.int32)  # out of range too
    sent = jnp.asarray(rng.random((T, ep)) < 0.7) & (row >= 0) & (row < rows)
    got = np.asarray(jax.jit(pack.sum_home_rows)(buffer, row, sent))
    b = np.asarray(buffer.astype(jnp.float32))
    want = np.zeros((T, H), np.float32)
    for t in range(T):
        for d in range(ep):
            if bool(sent[t, d]):
                want[t] = want[t] + b[d, int(row[t, d])]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert np.abs(want).sum() > 0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_home_sum_transpose_is_the_gather(dtype):
    """pack.home_sum: the same forward as sum_home_rows, and a cotangent written as a
    gather by each row's token that equals autodiff's scatter-add bitwise (one term per row),
    padding and unsent rows zero."""
    T, ep, k, rows = 24, 3, 2, 10  # rows < T: some slots overflow and are not sent
    rng = np.random.default_rng(7)
    ids = jnp.asarray(rng.integers(-1, 6, size=(T, k)), jnp.int32)
    _, sent, row, source_token, _ = pack.dispatch_indices(ids, ep, 2, rows)
    token_of_row = jnp.minimum(source_token, T - 1)
    padding = source_token >= T
    buffer = jnp.asarray(rng.standard_normal((ep, rows, 8)), dtype)
    ct = jnp.asarray(rng.standard_normal((T, 8)), jnp.float32)
    fast = lambda b: pack.home_sum(b, row, sent, token_of_row, padding)
    plain = lambda b: pack.home_sum_xla(b, row, sent)  # autodiff's transpose: a scatter
    np.testing.assert_array_equal(np.asarray(fast(buffer)), np.asarray(plain(buffer)))
    got = np.asarray(jax.jit(lambda c: jax.vjp(fast, buffer)[1](c)[0])(ct))
    want = np.asarray(jax.jit(lambda c: jax.vjp(plain, buffer)[1](c)[0])(ct))
    assert got.dtype == want.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    assert np.any(got != 0) and np.all(got[np.asarray(padding)] == 0)


def _home_sum_case(dtype, hidden, seed=11):
    T, ep, k, rows = 40, 2, 3, 24
    rng = np.random.default_rng(seed)
    ids = jnp.asarray(rng.integers(-1, 8, size=(T, k)), jnp.int32)
    _, sent, row, _, _ = pack.dispatch_indices(ids, ep, 4, rows)
    buffer = jnp.asarray(rng.standard_normal((ep, rows, hidden)) * 100, dtype)
    return buffer, row, sent


@pytest.mark.parametrize("built,dtype,hidden,kernel", [
    (False, jnp.bfloat16, 16, False), (True, jnp.bfloat16, 16, True),
    (True, jnp.float32, 12, True), (True, jnp.bfloat16, 12, False),
    (True, jnp.float32, 3, False)])
def test_home_sum_kernel_selection(monkeypatch, built, dtype, hidden, kernel):
    """Where the CUDA extension is built (faked here: lowering needs no GPU), the CUDA lowering
    of sum_home_rows calls mok_home_sum for [EP, R, H] buffers of whole 16-byte rows (not
    otherwise, e.g. the [EP, R, k] weights); without the extension it never does; the CPU
    lowering never does, and the CPU value is the XLA reduction's."""
    real = _ffi.kernels_built
    monkeypatch.setattr(_ffi, "kernels_built", lambda p: built if p == "cuda" else real(p))
    buffer, row, sent = _home_sum_case(dtype, hidden)
    f = jax.jit(lambda b: pack.sum_home_rows(b, row, sent))
    cuda = f.trace(buffer).lower(lowering_platforms=("cuda",)).as_text()
    assert ("mok_home_sum" in cuda) == kernel
    assert "mok_home_sum" not in f.lower(buffer).as_text()
    np.testing.assert_array_equal(np.asarray(f(buffer)),
                                  np.asarray(pack.home_sum_xla(buffer, row, sent)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,hidden", [(jnp.bfloat16, 64), (jnp.float32, 36)])
def test_home_sum_kernel_equals_xla_bitwise(dtype, hidden):
    """On a GPU: mok_home_sum gives the XLA reduction's bits (same float32 adds, same order)."""
    buffer, row, sent = _home_sum_case(dtype, hidden)
    gpu = jax.devices("gpu")[0]
    buffer, row, sent = (jax.device_put(a, gpu) for a in (buffer, row, sent))
    f = jax.jit(lambda b: pack.sum_home_rows(b, row, sent))
    assert "mok_home_sum" in f.lower(buffer).as_text()
    got = np.asarray(f(buffer))
    want = np.asarray(jax.jit(lambda b: pack.home_sum_xla(b, row, sent))(buffer))
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
