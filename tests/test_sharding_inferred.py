"""jax_mok.moe under plain jax.jit reads the shardings of its inputs (8 forced CPU devices).

No mesh argument, no jax_mok context: the inputs are placed with ``NamedSharding`` and the call
must run data parallel (experts replicated), expert parallel (experts sharded along E) or
data x expert, for auto axes (custom partitioning, at compile time) and explicit axes (the
types, at trace time). Each case is checked against the single-device call (values, aux and
every gradient within ``jax_mok.testing.tolerance``) and in the compiled per-device program:
no all-gather of an expert weight's shape, no full-size expert weight anywhere when they are
sharded, and the kernel's rows are this
device's (``EP x`` the tokens per device: its packed rows from every device of its group).
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import cpu_devices
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mok
from jax_mok import testing
from jax_mok.ep import partitioned
from jax_mok.kernels import _ffi, targets
from jax_mok.tuning import KernelTuning, PeerTuning

CPU_DEVICES = cpu_devices.CPU_DEVICES
cpu_devices.request()

# H, 2F and F all differ, so that an expert weight is recognisable by its shape in the HLO.
CONFIG = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=32, ffn_size=24,
                           num_shared_experts=1)
# name: (mesh shape, mesh axes, x's spec, the expert weights' spec)
LAYOUTS = {
    "data": ((8,), ("data",), P("data"), P()),
    "expert": ((8,), ("expert",), P("expert"), P("expert")),
    "data_x_expert": ((2, 4), ("data", "expert"), P(("data", "expert")), P("expert")),
    "tokens_over_data_only": ((2, 4), ("data", "expert"), P("data"), P("expert")),
    "sequence_sharded": ((2, 4), ("data", "expert"), P("data", "expert"), P("expert")),
}


def _problem(seed=0, config=CONFIG, shape=(8, 8)):
    params = testing.random_params(jax.random.key(seed), config)
    x = jax.random.normal(jax.random.key(seed + 1), (*shape, config.hidden_size))
    return x, params


def _place(x, params, mesh, x_spec, w_spec):
    def put(a, spec):
        return None if a is None else jax.device_put(a, NamedSharding(mesh, spec))

    placed = jax.tree.map(lambda a: put(a, P()), params)
    placed = dataclasses.replace(placed, w_gate_up=put(params.w_gate_up, w_spec),
                                 w_down=put(params.w_down, w_spec))
    return put(x, x_spec), placed


def _loss(x, params):
    y, aux = jax_mok.moe(x, params, return_aux=True)
    value = (jnp.sum(y.astype(jnp.float32) ** 2) + aux["load_balancing_loss"]
             + 0.1 * aux["router_z_loss"])
    return value, (y, aux)


_STEP = jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True)


def _compare(got, want, tol):
    (_, (y1, aux1)), g1 = got
    (_, (y0, aux0)), g0 = want
    assert y1.shape == y0.shape and y1.dtype == y0.dtype
    assert testing.rel_error(y1, y0) < tol
    np.testing.assert_array_equal(aux1["expert_counts"], aux0["expert_counts"])
    for name in ("load_balancing_loss", "router_z_loss"):
        np.testing.assert_allclose(aux1[name], aux0[name], rtol=1e-5)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g0),
                            strict=True):
        err = testing.rel_error(a, b)
        assert err < tol, f"gradient {jax.tree_util.keystr(path)}: rel error {err} >= {tol}"


def _spec(sharding, ndim):
    spec = tuple(sharding.spec)
    return spec + (None,) * (ndim - len(spec))


def kernel_rows(hlo: str) -> list[int]:
    """Rows of every mok_moe_fwd call's result ``[rows, H]`` in a compiled program."""
    return [int(m) for m in re.findall(
        r"= \w+\[(\d+),\d+\]\S* custom-call\([^)]*\).*?custom_call_target=\"mok_moe_fwd\"", hlo)]


def weight_all_gathers(hlo: str, config=CONFIG) -> list[str]:
    """The all-gathers in a compiled program whose result has an expert weight's shape
    ``[n, H, 2F]`` or ``[n, F, H]``."""
    H, F = config.hidden_size, config.ffn_size
    shapes = rf"\[\d+,(?:{H},{2 * F}|{F},{H})\]"
    return [line.strip()[:160] for line in hlo.splitlines()
            if re.search(rf"= \w+{shapes}\S* all-gather(-start)?\(", line)]


@pytest.mark.skipif(not _ffi.kernels_built("cpu"), reason="needs the CPU kernels")
@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_plain_jit_follows_the_input_shardings(name, axis_type):
    shape, names, x_spec, w_spec = LAYOUTS[name]
    mesh = cpu_devices.mesh(shape, names, axis_type)
    x, params = _problem()
    want = jax.jit(_STEP)(x, params)
    xs, ps = _place(x, params, mesh, x_spec, w_spec)
    step = jax.jit(_STEP)
    got = step(xs, ps)
    _compare(got, want, testing.tolerance(jnp.float32))
    (_, (y, _)), (_, grads) = got
    if not (name == "sequence_sharded" and axis_type == AxisType.Auto):
        # Auto axes: XLA lays out the reshapes around the layer; flattening [B@data, S@expert]
        # into tokens keeps only the batch's axis there (the values are the same).
        assert _spec(y.sharding, 3) == _spec(xs.sharding, 3), "y is not sharded like x"
    assert _spec(grads.w_gate_up.sharding, 3) == _spec(ps.w_gate_up.sharding, 3)

    hlo = step.lower(xs, ps).compile().as_text()
    assert not weight_all_gathers(hlo), f"expert weights gathered: {weight_all_gathers(hlo)}"
    ep = mesh.shape["expert"] if "expert" in w_spec else 1
    E, H, F = CONFIG.num_experts, CONFIG.hidden_size, CONFIG.ffn_size
    if ep > 1:
        assert f"f32[{E},{H},{2 * F}]" not in hlo, "a full-size w_gate_up in a device's program"
        assert f"f32[{E // ep},{H},{2 * F}]" in hlo
    tokens_per_device = x.size // H // CPU_DEVICES
    rows = kernel_rows(hlo)
    assert rows and set(rows) == {ep * tokens_per_device}, rows


@pytest.mark.skipif(not _ffi.kernels_built("cpu"), reason="needs the CPU kernels")
@pytest.mark.parametrize("name", ["data", "data_x_expert"])
@pytest.mark.parametrize("variant", ["saved_activations", "reference"])
def test_auto_axes_other_residual_policies(name, variant):
    """The partitioned ops' other paths under auto axes: the saved-activation pair (forward
    keeping h, backward reading it; on the CPU h is a placeholder and the backward recomputes,
    which still runs every partition callback of the pair) and the pure-JAX reference as the
    per-device experts."""
    shape, names, x_spec, w_spec = LAYOUTS[name]
    mesh = cpu_devices.mesh(shape, names, AxisType.Auto)
    config = CONFIG
    implementation = "reference" if variant == "reference" else "ffi"
    if variant == "saved_activations":
        config = dataclasses.replace(CONFIG, save_activations=True)
    x, params = _problem(11, config)

    def loss(x, p):
        return jnp.sum(jax_mok.moe(x, p, implementation=implementation) ** 2)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    want_value, want_grads = step(x, params)
    xs, ps = _place(x, params, mesh, x_spec, w_spec)
    partitioned._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value, grads = step(xs, ps)
    said = [str(w.message) for w in caught if "found at compile time" in str(w.message)]
    # Expert parallel found at compile time cannot keep saved activations: it says so, once.
    expected = variant == "saved_activations" and name == "data_x_expert"
    assert len(said) == int(expected), said
    if expected:
        assert "recomputes the gate/up GEMM" in said[0] and "jax.set_mesh(mesh)" in said[0]
    tol = testing.tolerance(jnp.float32)
    assert testing.rel_error(value, want_value) < tol
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        assert testing.rel_error(a, b) < tol
    assert not weight_all_gathers(step.lower(xs, ps).compile().as_text())


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def test_a_layout_that_would_gather_experts_raises(axis_type):
    mesh = cpu_devices.mesh((2, 4), ("data", "expert"), axis_type)
    x, params = _problem()
    xs, ps = _place(x, params, mesh, P(("data", "expert")), P(None, "expert"))
    # Explicit axes: a ValueError at trace time; auto axes: the same text from the partitioner.
    with pytest.raises(Exception, match=r"params.w_gate_up is sharded as .*would have to gather"):
        jax.jit(jax_mok.moe)(xs, ps)


@pytest.mark.skipif(not _ffi.kernels_built("cpu"), reason="needs the CPU kernels")
def test_ambient_data_mesh_without_expert_axis_runs_data_parallel():
    """jax.set_mesh with a ("data",) mesh and auto axes: no expert axis, so no shard_map plan;
    the kernels still run on each device's rows."""
    mesh = cpu_devices.mesh((8,), ("data",), AxisType.Auto)
    x, params = _problem(3)
    want = jax.jit(jax_mok.moe)(x, params)
    xs, ps = _place(x, params, mesh, P("data"), P())
    with jax.set_mesh(mesh):
        fn = jax.jit(jax_mok.moe)
        got = fn(xs, ps)
        hlo = fn.lower(xs, ps).compile().as_text()
    assert testing.rel_error(got, want) < testing.tolerance(jnp.float32)
    assert set(kernel_rows(hlo)) == {x.size // CONFIG.hidden_size // CPU_DEVICES}


def _user_shard_map(manual, mesh, check_vma=True):
    def per_shard(x, p):
        return jax_mok.moe(x, p)

    return jax.shard_map(per_shard, mesh=mesh, in_specs=(P(manual), P()), out_specs=P(manual),
                         axis_names=set(manual), check_vma=check_vma)


@pytest.mark.skipif(not _ffi.kernels_built("cpu"), reason="needs the CPU kernels")
@pytest.mark.parametrize("manual,names,check_vma", [
    (("data",), ("data", "expert"), False),  # expert axis free: EP nested over it
    (("data",), ("data", "model"), True),  # no expert axis: the layer runs on the shard
    (("data", "expert"), ("data", "expert"), True),  # every axis manual: per device
], ids=["free-expert-axis", "no-expert-axis", "all-manual"])
def test_inside_a_user_shard_map(manual, names, check_vma):
    """Manual axes are already split: the layer runs on the shard, expert parallel over a free
    expert axis (nested shard_map), per device otherwise. The routed output of a token does not
    depend on the others (dropless), so y and the gradients equal the single-device call's."""
    mesh = cpu_devices.mesh((2, 4), names, AxisType.Auto)
    x, params = _problem(5, shape=(64,))
    nested_ep = "expert" in names and "expert" not in manual
    xs, ps = _place(x, params, mesh, P(names), P("expert") if nested_ep else P())
    inner = _user_shard_map(manual, mesh, check_vma)
    fn = jax.jit(jax.value_and_grad(lambda x, p: jnp.sum(inner(x, p) ** 2), argnums=(0, 1)))
    value, grads = fn(xs, ps)
    want_value, want_grads = jax.jit(jax.value_and_grad(
        lambda x, p: jnp.sum(jax_mok.moe(x, p) ** 2), argnums=(0, 1)))(x, params)
    tol = testing.tolerance(jnp.float32)
    assert testing.rel_error(value, want_value) < tol
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        assert testing.rel_error(a, b) < tol
    hlo = fn.lower(xs, ps).compile().as_text()
    assert not weight_all_gathers(hlo)
    assert ("all-to-all" in hlo) == nested_ep


@pytest.mark.skipif(not _ffi.kernels_built("cpu"), reason="needs the CPU kernels")
def test_nested_expert_parallel_under_check_vma_says_why_no_gradient():
    """JAX cannot transpose a shard_map nested in one that checks vma types: the forward runs,
    the gradient raises jax_mok's NotImplementedError naming the way out."""
    mesh = cpu_devices.mesh((2, 4), ("data", "expert"), AxisType.Auto)
    x, params = _problem(5, shape=(64,))
    xs, ps = _place(x, params, mesh, P("data"), P("expert"))
    inner = _user_shard_map(("data",), mesh, check_vma=True)
    y = jax.jit(inner)(xs, ps)
    assert testing.rel_error(y, jax.jit(jax_mok.moe)(x, params)) < testing.tolerance(jnp.float32)
    with pytest.raises(NotImplementedError, match="pass check_vma=False"):
        jax.jit(jax.grad(lambda x: jnp.sum(inner(x, ps) ** 2)))(xs)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def test_zero_tokens_on_a_mesh(axis_type):
    mesh = cpu_devices.mesh((2, 4), ("data", "expert"), axis_type)
    _, params = _problem()
    x = jnp.zeros((0, CONFIG.hidden_size))
    for kwargs in ({"mesh": mesh}, {}):
        xs, ps = _place(x, params, mesh, P(), P("expert"))
        y, aux = jax.jit(lambda x, p, kw=kwargs: jax_mok.moe(x, p, return_aux=True, **kw))(
            xs, ps)
        assert y.shape == (0, CONFIG.hidden_size)
        assert float(aux["load_balancing_loss"]) == 0.0 and float(aux["router_z_loss"]) == 0.0
        assert int(aux["expert_counts"].sum()) == 0 and int(aux["dropped_tokens"]) == 0
        # The router term keeps an output that depends on the inputs (a jit of constants only
        # runs on one device, which explicit axes refuse).
        grads = jax.jit(jax.grad(lambda p, x, kw=kwargs: jnp.sum(jax_mok.moe(x, p, **kw))
                                 + jnp.sum(p.router ** 2)))(ps, xs)
        np.testing.assert_allclose(grads.router, 2 * params.router, rtol=1e-6)
        for g in (grads.w_gate_up, grads.w_down, grads.shared_gate_up, grads.shared_down):
            assert float(jnp.abs(g).sum()) == 0.0


@pytest.mark.parametrize("cuda_built", [False, True], ids=["cpu-only", "cuda-built"])
def test_vmap_of_an_expert_parallel_call(monkeypatch, cuda_built):
    """vmap over x of an expert-parallel call equals the call per example; with the CUDA
    extension built (faked: lowering needs no GPU) the mok_home_sum call in the trace folds the
    batch instead of failing for want of a batching rule."""
    real = _ffi.kernels_built
    monkeypatch.setattr(_ffi, "kernels_built",
                        lambda p: cuda_built if p == "cuda" else real(p))
    mesh = cpu_devices.mesh((2, 4), ("data", "expert"), AxisType.Explicit)
    config = dataclasses.replace(CONFIG, num_shared_experts=0)
    x, params = _problem(7, config, shape=(3, 16))
    fn = jax.jit(jax.vmap(lambda x: jax_mok.moe(x, params, mesh=mesh, transport="xla")))
    got = fn(x)
    want = jnp.stack([jax.jit(jax_mok.moe)(x[i], params) for i in range(x.shape[0])])
    assert testing.rel_error(got, want) < testing.tolerance(jnp.float32)
    cuda = fn.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert ("mok_home_sum" in cuda) == cuda_built


@pytest.mark.parametrize("batched_buffer", [True, False])
def test_home_sum_folds_a_vmapped_batch(batched_buffer):
    """targets.home_sum under vmap is one call on the folded rows; its CPU stand-in (the same
    sums in the same order) checks the fold's index arithmetic."""
    B, ep, R, H, T = 3, 2, 5, 8, 6
    rng = np.random.default_rng(0)
    buffer = jnp.asarray(rng.standard_normal((B, ep, R, H)), jnp.float32)
    if not batched_buffer:
        buffer = buffer[0]
    home_row = jnp.asarray(rng.integers(-1, R, size=(B, T, ep)), jnp.int32)
    calls = []

    def stand_in(buffer, home_row):  # what mok_home_sum computes, in pure JAX
        calls.append(buffer.shape)
        picked = [jnp.where(home_row[:, d, None] >= 0, buffer[d][jnp.maximum(home_row[:, d], 0)],
                            0.0) for d in range(buffer.shape[0])]
        total = 0.0 + picked[0]
        for term in picked[1:]:
            total = total + term
        return total

    # Both cases trace the same per-example and folded shapes: newer jax reuses the first case's
    # traces (and their stand-in) unless the caches are cleared.
    jax.clear_caches()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(jax.ffi, "ffi_call", lambda *a, **k: stand_in)
        got = jax.vmap(targets.home_sum, in_axes=(0 if batched_buffer else None, 0))(
            buffer, home_row)
    # custom_vmap traces the per-example call once for its types; the batched value is one
    # call with the batch folded into the rows.
    assert calls == [(ep, R, H), (ep, B * R, H)]
    full = buffer if batched_buffer else jnp.broadcast_to(buffer, (B, ep, R, H))
    want = jnp.stack([stand_in(full[b], home_row[b]) for b in range(B)])
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_peer_calls_have_a_batching_rule():
    """The fused peer call under vmap lowers (one call per example, in order) instead of
    JAX's "ffi_call vmap_method=None" error."""
    ep, R, H, k, T, E_loc, F = 2, 4, 8, 2, 4, 2, 8
    args = (jnp.zeros((3, ep, R, H), jnp.bfloat16), jnp.zeros((3, ep, R, k), jnp.int32),
            jnp.zeros((3, ep, R, k), jnp.float32), jnp.zeros((3, T, ep), jnp.int32),
            jnp.zeros((E_loc, H, 2 * F), jnp.bfloat16), jnp.zeros((E_loc, F, H), jnp.bfloat16))

    def call(sx, sids, sw, home, gu, dn):
        return targets.ep_moe_forward(sx, sids, sw, home, gu, dn, 0, KernelTuning(),
                                      PeerTuning())

    fn = jax.jit(jax.vmap(call, in_axes=(0, 0, 0, 0, None, None)))
    text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "mok_ep_moe_fwd" in text
