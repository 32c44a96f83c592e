"""transport="peer" (NVLink peer memory, docs/peer-transport.md).

The GPU tests (``multigpu``: 2 CUDA GPUs, e.g. nvidia-h200-x2 via tools/gpu_check_ep.sh; results
in BENCHMARKS.md). The CPU tests at the top check the JAX glue: with availability faked, the EP
program traces, differentiates and lowers with the peer targets in place of every all-to-all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import cpu_devices
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mok
from jax_mok import sharding, testing
from jax_mok.ep import peer, plan, workspace
from jax_mok.tuning import PeerTuning, Tuning

cpu_devices.request()


def _config(**kw):
    base = {"num_experts": 8, "top_k": 2, "hidden_size": 64, "ffn_size": 32}
    return jax_mok.MoEConfig(**{**base, **kw})


def _loss(x, params, **kw):
    y, aux = jax_mok.moe(x, params, return_aux=True, **kw)
    return jnp.sum(y.astype(jnp.float32) ** 2) + aux["load_balancing_loss"], (y, aux)


def _value_and_grad(x, params, **kw):
    fn = jax.value_and_grad(lambda x, p: _loss(x, p, **kw), argnums=(0, 1), has_aux=True)
    return jax.jit(fn)


@pytest.mark.parametrize("data,ep", [(1, 2), (2, 2)])
def test_staged_program_lowers_on_cpu(monkeypatch, data, ep):
    """CPU: fake availability and a workspace id; where the experts are not the CUDA kernels
    (here the reference), the training step's HLO uses the staged peer targets (1 dispatch + 1
    combine forward; 1 reverse combine + 1 reverse dispatch backward, both dispatch targets) and
    no all-to-all. Nothing runs: the targets exist only for platform CUDA."""
    cpu_devices.fake_peer(monkeypatch)
    mesh = jax.sharding.Mesh(np.array(cpu_devices.devices(data * ep)).reshape(data, ep),
                             ("data", "expert"))
    config = _config()
    params = testing.random_params(jax.random.key(0), config)
    x = jax.random.normal(jax.random.key(1), (16, 64))
    fn = _value_and_grad(x, params, mesh=mesh, transport="peer", implementation="reference")
    text = fn.lower(x, params).as_text()
    assert text.count("mok_ep_dispatch") == 3, text.count("mok_ep_dispatch")
    assert text.count("mok_ep_combine") == 1
    assert "mok_ep_moe" not in text and "mok_moe" not in text
    assert "all_to_all" not in text and "all-to-all" not in text


@pytest.mark.parametrize("implementation", ["ffi", "reference"])
def test_inference_lowers_to_one_fused_call_on_cpu(monkeypatch, implementation):
    """CPU: without differentiation the layer with the kernels is one ``mok_ep_moe_fwd`` call
    (dispatch, the local experts and combine); with the reference experts it is the staged
    dispatch + the experts + combine. Training steps:
    test_fused_training_step_lowers_to_its_calls_on_cpu."""
    cpu_devices.fake_peer(monkeypatch)
    mesh = jax.sharding.Mesh(np.array(cpu_devices.devices(2)), ("expert",))
    config = _config()
    params = testing.random_params(jax.random.key(0), config)
    x = jax.random.normal(jax.random.key(1), (16, 64))
    fn = jax.jit(lambda x, p: jax_mok.moe(x, p, mesh=mesh, transport="peer",
                                          implementation=implementation))
    text = fn.lower(x, params).as_text()
    counts = [text.count(t) for t in ("mok_ep_moe_fwd", "mok_ep_dispatch", "mok_ep_combine")]
    assert counts == ([1, 0, 0] if implementation == "ffi" else [0, 1, 1]), counts
    assert "mok_moe_fwd" not in text  # the local experts: inside the fused call, or pure JAX


def _assert_trees_close(got, want, tol):
    """Every leaf of ``got`` within relative error ``tol`` of ``want``'s (the same tree), the
    failing leaf named."""
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got),
                            strict=True):
        err = testing.rel_error(g, w)
        assert err < tol, f"gradient {jax.tree_util.keystr(path)}: rel error {err}"


class _HostExchange:
    """The peer transport's semantics on CPU devices: each rank's chunks meet in a host-side
    rendezvous (pure_callback), keyed by (group, call number), as the kernels' epochs key them.
    Checks the JAX glue (packing, home rows, custom_vjp transposes), not the CUDA kernels."""

    def __init__(self, mesh, axis: str):
        self.axis, self.ep = axis, int(mesh.shape[axis])
        self.others = tuple(a for a in mesh.axis_names if a != axis)
        self.cv = threading.Condition()
        self.box, self.calls, self.phases = {}, {}, []
        self.sent = []  # (phase, dtype, row width) of every exchange's rows, at trace time

    def _meet(self, group, rank, arrays):
        key = (int(group), int(rank))
        with self.cv:
            n = self.calls.get(key, 0)
            self.calls[key] = n + 1
            self.box[(int(group), n, int(rank))] = arrays
            self.cv.notify_all()
            if not self.cv.wait_for(lambda: all((int(group), n, s) in self.box
                                                for s in range(self.ep)), timeout=60):
                raise RuntimeError(f"emulated peer exchange: rank {rank} waited in vain")
            return tuple(np.stack([self.box[(int(group), n, s)][i][int(rank)]
                                   for s in range(self.ep)]) for i in range(len(arrays)))

    def _call(self, *arrays):
        rank = jax.lax.axis_index(self.axis)
        group = jax.lax.axis_index(self.others) if self.others else jnp.int32(0)
        shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays)
        return jax.pure_callback(lambda g, r, *a: self._meet(g, r, a), shapes, group, rank,
                                 *arrays)

    def exchange(self, x, ids, w, workspace_id, phase):
        self.phases.append(phase)
        self.sent.append((phase, x.dtype, x.shape[-1]))
        return self._call(x, ids, w)

    def combine(self, rows, home_row, workspace_id, phase):
        self.phases.append(phase)
        self.sent.append((phase, rows.dtype, rows.shape[-1]))
        (recv,) = self._call(rows)  # [EP, R, H]: chunk d = rows rank d computed for me
        d = jnp.arange(self.ep)[None, :]
        picked = recv[d, jnp.clip(home_row, 0, rows.shape[1] - 1)].astype(jnp.float32)
        return jnp.where((home_row >= 0)[:, :, None], picked, 0.0).sum(1)  # d ascending


@pytest.mark.parametrize("data,ep,capacity_factor", [(1, 2, None), (2, 2, 0.75), (1, 4, None)])
def test_emulated_peer_glue_equals_xla_transport(monkeypatch, data, ep, capacity_factor):
    """CPU: transport "peer" with the exchange emulated gives transport "xla"'s values, aux and
    gradients (x and every weight)."""
    mesh = jax.sharding.Mesh(np.array(cpu_devices.devices(data * ep)).reshape(data, ep),
                             ("data", "expert"))
    emulator = _HostExchange(mesh, "expert")
    monkeypatch.setattr(peer, "_backend", emulator)
    cpu_devices.fake_peer(monkeypatch)
    config = _config(capacity_factor=capacity_factor, num_shared_experts=1)
    params = testing.random_params(jax.random.key(0), config)
    x = jax.random.normal(jax.random.key(1), (32, 64))
    (l0, (y0, aux0)), g0 = _value_and_grad(x, params, mesh=mesh, transport="xla")(x, params)
    (l1, (y1, aux1)), g1 = _value_and_grad(x, params, mesh=mesh, transport="peer")(x, params)
    assert sorted(set(emulator.phases)) == [peer.DISPATCH, peer.COMBINE, peer.REVERSE_DISPATCH,
                                            peer.REVERSE_COMBINE]
    assert testing.rel_error(y1, y0) < 1e-6
    np.testing.assert_array_equal(aux1["expert_counts"], aux0["expert_counts"])
    assert int(aux1["dropped_tokens"]) == int(aux0["dropped_tokens"])
    _assert_trees_close(g1, g0, 1e-6)


@pytest.mark.parametrize("recipe", ["fp8_block", "mxfp8"])
@pytest.mark.parametrize("data,ep", [(1, 2), (2, 2), (1, 4)])
def test_emulated_peer_fp8_equals_xla_transport(monkeypatch, recipe, data, ep):
    """CPU: with an FP8 recipe, transport "peer" (exchange emulated) gives the XLA transport's
    values and gradients; the rows to the experts (x forward, dy backward) cross as packed uint8
    rows (values + scales, packed_width(H) bytes: 0.53x bf16's at H = 256), the results home and
    x's cotangent back in x's dtype."""
    from jax_mok.quantization import rows as fp8_rows

    mesh = jax.sharding.Mesh(np.array(cpu_devices.devices(data * ep)).reshape(data, ep),
                             ("data", "expert"))
    emulator = _HostExchange(mesh, "expert")
    monkeypatch.setattr(peer, "_backend", emulator)
    cpu_devices.fake_peer(monkeypatch)
    H = 256
    config = _config(hidden_size=H, ffn_size=128, quantization=recipe,
                     fp8_weight_gradients="fp8")
    params = testing.random_params(jax.random.key(0), config)
    x = jax.random.normal(jax.random.key(1), (32, H)).astype(jnp.bfloat16)
    (l0, (y0, aux0)), g0 = _value_and_grad(x, params, mesh=mesh, transport="xla")(x, params)
    (l1, (y1, aux1)), g1 = _value_and_grad(x, params, mesh=mesh, transport="peer")(x, params)
    width = fp8_rows.packed_width(H, recipe)
    assert sorted(set(emulator.sent)) == sorted({
        (peer.DISPATCH, jnp.uint8, width), (peer.REVERSE_COMBINE, jnp.uint8, width),
        (peer.COMBINE, jnp.bfloat16, H), (peer.REVERSE_DISPATCH, jnp.bfloat16, H)})
    assert width / (2 * H) < 0.55
    np.testing.assert_array_equal(np.asarray(y1, np.float32), np.asarray(y0, np.float32))
    np.testing.assert_array_equal(aux1["expert_counts"], aux0["expert_counts"])
    _assert_trees_close(g1, g0, 1e-6)


def test_fp8_staged_program_lowers_on_cpu(monkeypatch):
    """CPU: with an FP8 recipe the peer transport runs the staged calls even with the kernels
    (the fused calls move unquantized rows): 1 dispatch + 1 combine forward, 1 reverse combine +
    1 reverse dispatch backward, no all-to-all; "auto" still picks "xla" for FP8, saying why."""
    cpu_devices.fake_peer(monkeypatch)
    mesh = jax.sharding.Mesh(np.array(cpu_devices.devices(2)), ("expert",))
    config = _config(hidden_size=128, ffn_size=128, quantization="fp8_block",
                     fp8_weight_gradients="fp8")
    params = testing.random_params(jax.random.key(0), config)
    x = jax.random.normal(jax.random.key(1), (16, 128))
    text = _value_and_grad(x, params, mesh=mesh, transport="peer",
                           implementation="ffi").lower(x, params).as_text()
    assert text.count("mok_ep_dispatch") == 3 and text.count("mok_ep_combine") == 1
    assert "mok_ep_moe" not in text
    assert "all_to_all" not in text and "all-to-all" not in text
    monkeypatch.setattr(plan, "_WARNED", set())
    with pytest.warns(UserWarning, match="FP8 path .* has not yet run on GPUs"):
        text = _value_and_grad(x, params, mesh=mesh, transport="auto",
                               implementation="ffi").lower(x, params).as_text()
    assert "mok_ep_dispatch" not in text


# ------------------------------------------------------------------ GPU (2 devices, one process)

def _gpu_mesh():
    gpus = jax.devices("gpu")
    mesh = jax.sharding.Mesh(np.array(gpus[:2]), ("expert",))
    ok, reason = workspace.peer_transport_available(mesh, "expert")
    assert ok, reason  # on 2 x H200 this must hold; say why if not
    return mesh


@pytest.mark.multigpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("capacity_factor", [None, 0.75])
def test_values_and_gradients_equal_xla_transport(dtype, capacity_factor):
    mesh = _gpu_mesh()
    config = _config(capacity_factor=capacity_factor, num_shared_experts=1)
    params = testing.random_params(jax.random.key(0), config, dtype)
    x = jax.random.normal(jax.random.key(1), (256, 64)).astype(dtype)
    (_, (y0, aux0)), g0 = _value_and_grad(x, params, mesh=mesh, transport="xla")(x, params)
    (_, (y1, aux1)), g1 = _value_and_grad(x, params, mesh=mesh, transport="peer")(x, params)
    tol = testing.tolerance(dtype)
    assert testing.rel_error(y1, y0) < tol
    np.testing.assert_array_equal(aux1["expert_counts"], aux0["expert_counts"])
    assert int(aux1["dropped_tokens"]) == int(aux0["dropped_tokens"])
    _assert_trees_close(g1, g0, tol)


@pytest.mark.multigpu
@pytest.mark.parametrize("recipe", ["fp8_block", "mxfp8"])
def test_fp8_values_and_gradients_equal_xla_transport(recipe):
    """2 GPUs: the FP8 rows through peer memory (the staged calls with packed uint8 rows) give
    the XLA transport's values and gradients (the emulated CPU test's claim, on the kernels)."""
    mesh = _gpu_mesh()
    config = _config(hidden_size=256, ffn_size=128, quantization=recipe,
                     fp8_weight_gradients="fp8")
    params = testing.random_params(jax.random.key(0), config)
    x = jax.random.normal(jax.random.key(1), (256, 256)).astype(jnp.bfloat16)
    (_, (y0, aux0)), g0 = _value_and_grad(x, params, mesh=mesh, transport="xla")(x, params)
    (_, (y1, aux1)), g1 = _value_and_grad(x, params, mesh=mesh, transport="peer")(x, params)
    tol = testing.tolerance(jnp.float32)  # the same operands; float32 summation order only
    assert testing.rel_error(y1, y0) < tol
    np.testing.assert_array_equal(aux1["expert_counts"], aux0["expert_counts"])
    _assert_trees_close(g1, g0, tol)


@pytest.mark.multigpu
def test_single_device_step_then_peer_step():
    """Issue #18's sequence, in one process: a float32 training step on one GPU without a mesh,
    then the same step with the experts over a 2-GPU ("expert",) mesh and transport="peer". It
    timed out in the peer backward (rank 0 waiting for rank 1) when the single-device step ran
    first; both steps must agree with each other."""
    config = jax_mok.MoEConfig(num_experts=16, top_k=4, hidden_size=512, ffn_size=256)
    params = testing.random_params(jax.random.key(3), config, jnp.float32)
    x = jax.random.normal(jax.random.key(4), (2048, 512), jnp.float32)
    c = jax.random.normal(jax.random.key(5), (2048, 512), jnp.float32)

    def loss(x, p, **kw):
        return jnp.sum(jax_mok.moe(x, p, **kw) * c)

    single = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    v0, (dx0, dp0) = jax.block_until_ready(single(x, params))
    mesh = _gpu_mesh()
    placed = jax.device_put(params, sharding.param_shardings(params, mesh))
    step = jax.jit(jax.value_and_grad(
        lambda x, p: loss(x, p, mesh=mesh, transport="peer"), argnums=(0, 1)))
    v1, (dx1, dp1) = jax.block_until_ready(step(x, placed))
    tol = testing.tolerance(jnp.float32)
    assert abs(float(v1) - float(v0)) <= tol * abs(float(v0))
    assert testing.rel_error(dx1, dx0) < tol
    _assert_trees_close(dp1, dp0, tol)


@pytest.mark.multigpu
@pytest.mark.parametrize("transport", ["peer", "xla"])
def test_bitwise_deterministic(transport):
    """Values, aux and every gradient are bitwise equal over repeated calls (the "xla" case
    tells a nondeterminism of the shared JAX glue from one of the peer exchange)."""
    mesh = _gpu_mesh()
    config = _config()
    params = testing.random_params(jax.random.key(0), config, jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (512, 64)).astype(jnp.bfloat16)
    fn = _value_and_grad(x, params, mesh=mesh, transport=transport)
    first = jax.tree_util.tree_leaves_with_path(fn(x, params))
    for call in range(1, 4):
        again = jax.tree.leaves(fn(x, params))
        for (path, a), b in zip(first, again, strict=True):
            a, b = np.atleast_1d(np.asarray(a)), np.atleast_1d(np.asarray(b))
            if not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
                bad = a != b
                rows = np.unique(np.nonzero(bad)[0]) if bad.ndim else []
                raise AssertionError(
                    f"{transport}: {jax.tree_util.keystr(path)} {a.shape} differs between call 0 "
                    f"and call {call}: {int(bad.sum())} elements in {len(rows)} leading-index "
                    f"rows (first rows {list(rows[:8])}), max |diff| "
                    f"{float(np.max(np.abs(a.astype(np.float32) - b.astype(np.float32))))}")


@pytest.mark.multigpu
def test_back_to_back_calls_with_different_routings():
    """Several layers in one program and several programs in a row: epochs advance on the
    device, halves alternate, no stale rows leak from the previous call."""
    mesh = _gpu_mesh()
    config = _config()
    layers = [testing.random_params(jax.random.key(i), config) for i in range(3)]

    def stack(x, transport):
        for p in layers:
            x = x + jax_mok.moe(x, p, mesh=mesh, transport=transport)
        return x

    peer_fn = jax.jit(lambda x: stack(x, "peer"))
    xla_fn = jax.jit(lambda x: stack(x, "xla"))
    for step in range(5):
        x = jax.random.normal(jax.random.key(100 + step), (128, 64))
        assert testing.rel_error(peer_fn(x), xla_fn(x)) < 1e-5, f"step {step}"


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype != np.bool_ else a


@pytest.mark.multigpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("capacity_factor", [None, 0.75])
def test_fused_forward_equals_xla_transport(dtype, capacity_factor):
    """The fused forward (mok_ep_moe_fwd: one call) gives the XLA transport's values (the same
    local kernels) within the dtype's tolerance; the compiled program is checked to contain the
    call it is meant to test."""
    mesh = _gpu_mesh()
    config = _config(capacity_factor=capacity_factor, num_shared_experts=1)
    params = testing.random_params(jax.random.key(3), config, dtype)
    x = jax.random.normal(jax.random.key(4), (512, 64)).astype(dtype)
    fn = jax.jit(lambda x, p: jax_mok.moe(x, p, mesh=mesh, transport="peer"))
    assert "mok_ep_moe_fwd" in fn.lower(x, params).as_text()
    want = jax_mok.moe(x, params, mesh=mesh, transport="xla")
    assert testing.rel_error(fn(x, params), want) < testing.tolerance(dtype)


@pytest.mark.multigpu
def test_fused_and_staged_calls_interleave():
    """Inference and training steps (fused: the workspace's fixed areas 2-3) and staged steps
    (the reference experts between mok_ep_dispatch and mok_ep_combine: the alternating halves)
    on one workspace, in turn, with new routings each step: every result equals the XLA
    transport's, and repeating an inference call gives the same bits."""
    mesh = _gpu_mesh()
    config = _config()
    params = testing.random_params(jax.random.key(5), config, jnp.bfloat16)
    infer = {t: jax.jit(lambda x, t=t: jax_mok.moe(x, params, mesh=mesh, transport=t))
             for t in ("peer", "xla")}
    grads = {t: jax.jit(jax.grad(lambda x, t=t: jnp.sum(
        jax_mok.moe(x, params, mesh=mesh, transport=t).astype(jnp.float32) ** 2)))
        for t in ("peer", "xla")}
    staged = {t: jax.jit(jax.grad(lambda x, t=t: jnp.sum(jax_mok.moe(
        x, params, mesh=mesh, transport=t, implementation="reference").astype(jnp.float32) ** 2)))
        for t in ("peer", "xla")}
    tol = testing.tolerance(jnp.bfloat16)
    for step in range(4):
        x = jax.random.normal(jax.random.key(200 + step), (256, 64)).astype(jnp.bfloat16)
        y = infer["peer"](x)
        assert testing.rel_error(y, infer["xla"](x)) < tol, f"step {step} inference"
        assert testing.rel_error(grads["peer"](x), grads["xla"](x)) < tol, f"step {step} grad"
        assert testing.rel_error(staged["peer"](x), staged["xla"](x)) < tol, f"step {step} staged"
        np.testing.assert_array_equal(_bits(infer["peer"](x)), _bits(y))


@pytest.mark.multigpu
@pytest.mark.parametrize("dtype,capacity_factor,save", [
    (jnp.bfloat16, None, None), (jnp.bfloat16, 0.75, None), (jnp.float32, None, None),
    (jnp.float32, 0.75, None), (jnp.bfloat16, None, False)])
def test_fused_training_step_equals_xla_transport(dtype, capacity_factor, save):
    """The training step as two fused calls (mok_ep_moe_fwd_train, mok_ep_moe_bwd; the compiled
    program is checked to contain them) gives the XLA transport's value, aux and every gradient
    within the dtype's tolerance. ``save=False``: the backward recomputes the gate/up GEMM
    instead of reading the saved h."""
    mesh = _gpu_mesh()
    config = _config(capacity_factor=capacity_factor, num_shared_experts=1,
                     save_activations=save)
    params = testing.random_params(jax.random.key(6), config, dtype)
    x = jax.random.normal(jax.random.key(7), (512, 64)).astype(dtype)
    fn = _value_and_grad(x, params, mesh=mesh, transport="peer")
    text = fn.lower(x, params).as_text()
    assert "mok_ep_moe_fwd_train" in text and "mok_ep_moe_bwd" in text
    (_, (y1, aux1)), g1 = fn(x, params)
    (_, (y0, aux0)), g0 = _value_and_grad(x, params, mesh=mesh, transport="xla")(x, params)
    tol = testing.tolerance(dtype)
    assert testing.rel_error(y1, y0) < tol
    np.testing.assert_array_equal(aux1["expert_counts"], aux0["expert_counts"])
    _assert_trees_close(g1, g0, tol)


def test_fused_training_step_lowers_to_its_calls_on_cpu(monkeypatch):
    """CPU: with the kernels a training step is one mok_ep_moe_fwd_train and one mok_ep_moe_bwd
    call (no staged exchange at all, no local kernel call outside them)."""
    cpu_devices.fake_peer(monkeypatch)
    mesh = jax.sharding.Mesh(np.array(cpu_devices.devices(2)), ("expert",))
    params = testing.random_params(jax.random.key(0), _config())
    x = jax.random.normal(jax.random.key(1), (16, 64))
    text = _value_and_grad(x, params, mesh=mesh, transport="peer").lower(x, params).as_text()
    names = ("mok_ep_moe_fwd_train", "mok_ep_dispatch", "mok_ep_combine", "mok_ep_moe_bwd")
    counts = [text.count(t) for t in names]
    assert counts == [1, 0, 0, 1], counts
    assert "mok_moe_bwd" not in text.replace("mok_ep_moe_bwd", "")


# Peer tunings the default test process does not run (copy engines, sync check, 2 CTAs per SM).
_EXCHANGE_SETTINGS = [PeerTuning(copy="sm"), PeerTuning(check="deferred"),
                      PeerTuning(copy="sm", check="deferred"), PeerTuning(copy="sm", ctas_per_sm=1),
                      PeerTuning(copy="sm", ctas_per_sm=4)]


@pytest.mark.multigpu
@pytest.mark.parametrize("setting", _EXCHANGE_SETTINGS, ids=repr)
def test_exchange_settings_give_the_same_bits(setting):
    """An exchange setting changes how bytes move (copy engines or the kernel's own stores, the
    exchange grid) or when errors are checked, never a value: on back-to-back calls the fused
    inference, the fused training step's gradient and the staged calls (reference experts) give
    the default setting's bits, and the default is close to transport "xla"."""
    mesh = _gpu_mesh()
    cfg = _config()
    params = testing.random_params(jax.random.key(3), cfg, jnp.bfloat16)

    def programs(peer_tuning):
        tuning = Tuning(peer=peer_tuning)
        moe = lambda x, **kw: jax_mok.moe(x, params, mesh=mesh, transport="peer", tuning=tuning,
                                          **kw)
        sq = lambda y: jnp.sum(y.astype(jnp.float32) ** 2)
        return (jax.jit(moe), jax.jit(jax.grad(lambda x: sq(moe(x)))),
                jax.jit(lambda x: moe(x, implementation="reference")))

    default, tuned = programs(PeerTuning()), programs(setting)
    for step in range(3):  # back-to-back calls: the epochs and areas advance
        x = jax.random.normal(jax.random.key(10 + step), (512, 64)).astype(jnp.bfloat16)
        for name, a, b in zip(("inference", "gradient", "staged"), default, tuned, strict=True):
            np.testing.assert_array_equal(_bits(a(x)), _bits(b(x)), err_msg=f"{name} {step}")
    want = jax_mok.moe(x, params, mesh=mesh, transport="xla")
    assert testing.rel_error(default[0](x), want) < testing.tolerance(jnp.bfloat16)


_ONE_SIDED = textwrap.dedent("""
    import sys, time, jax, jax.numpy as jnp, numpy as np
    from jax_mok.ep import peer, workspace
    from jax_mok.kernels import targets
    from jax_mok.tuning import KernelTuning, PeerTuning
    tuning = PeerTuning(timeout_ms=500)
    gpus = jax.devices("gpu")[:2]
    mesh = jax.sharding.Mesh(np.array(gpus), ("expert",))
    spec = workspace.WorkspaceSpec(2, 8, 64, 2, "float32")
    ws = workspace.workspace_for(mesh, "expert", spec)
    x = jax.device_put(jnp.ones((2, 8, 64)), gpus[0])
    ids = jax.device_put(jnp.zeros((2, 8, 2), jnp.int32), gpus[0])
    w = jax.device_put(jnp.zeros((2, 8, 2)), gpus[0])
    if sys.argv[1] == "fused":  # the fused forward's dispatch waits the same way
        home = jax.device_put(jnp.zeros((8, 2), jnp.int32), gpus[0])
        gu = jax.device_put(jnp.ones((1, 64, 32)), gpus[0])
        dn = jax.device_put(jnp.ones((1, 16, 64)), gpus[0])
        fn = jax.jit(lambda a, b, c: targets.ep_moe_forward(a, b, c, home, gu, dn, ws,
                                                             KernelTuning(), tuning))
    else:
        fn = jax.jit(lambda a, b, c: peer.dispatch(a, b, c, ws, tuning))
    t0 = time.time()
    try:  # check="sync" raises on the first call, "deferred" on the second
        for _ in range(2):
            jax.block_until_ready(fn(x, ids, w))
        print("NO ERROR")
    except Exception as e:
        print("ERROR after %.1f s: %s" % (time.time() - t0, e))
""")


@pytest.mark.multigpu
@pytest.mark.parametrize("call", ["dispatch", "fused"])
def test_one_sided_call_times_out_with_an_error(call):
    """Only rank 0 launches: its bounded wait (PeerTuning.timeout_ms=500) must end in an error
    naming rank 1, not a hang. A subprocess: the timeout poisons the workspace."""
    # The pytest process already holds XLA's preallocation on both GPUs: allocate on demand.
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    proc = subprocess.run([sys.executable, "-c", _ONE_SIDED, call], capture_output=True,
                          text=True, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert "ERROR after" in out, out[-3000:]
    assert "waiting for rank 1" in out and "dispatch" in out, out[-3000:]


_TWO_PROCESSES = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp, numpy as np
    pid, port = int(sys.argv[1]), sys.argv[2]
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                               local_device_ids=[pid])
    import jax_mok
    from jax_mok import testing
    from jax_mok.ep import workspace
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("expert",))
    print("AVAILABLE", workspace.peer_transport_available(mesh, "expert"), flush=True)
    from jax.sharding import NamedSharding, PartitionSpec as P
    cfg = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=64, ffn_size=32)
    def global_array(value, spec):  # the same host data in both processes -> one global array
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, NamedSharding(mesh, spec),
                                            lambda i: value[i])
    params = jax.tree.map(lambda a: global_array(a, P()),
                          testing.random_params(jax.random.key(0), cfg))
    x = global_array(jax.random.normal(jax.random.key(1), (256, 64)), P("expert"))
    def loss(x, p, transport):
        y = jax_mok.moe(x, p, mesh=mesh, transport=transport)
        return jnp.sum(y.astype(jnp.float32) ** 2)
    local = lambda a: np.asarray(a.addressable_data(0))  # replicated: the local copy is whole
    out = {}
    for t in ("xla", "peer"):
        value, grads = jax.jit(jax.value_and_grad(lambda x, p: loss(x, p, t), argnums=1))(x, params)
        y = jax.jit(lambda x, p: jax_mok.moe(x, p, mesh=mesh, transport=t))(x, params)  # fused
        out[t] = (float(local(value)), float(np.sum(local(grads.router) ** 2)),
                  float(np.sum(np.asarray(y.addressable_data(0), np.float32) ** 2)))
    print("RESULT", pid, out["xla"], out["peer"], flush=True)
    jax.distributed.shutdown()
""")


@pytest.mark.multigpu
def test_two_processes_one_gpu_each():
    """One process per GPU: CUDA IPC handles through jax.distributed's key-value store. Loss and
    router gradient (the fused training calls) and the inference output (the fused call) equal
    transport "xla"'s."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # pytest holds its share
    procs = [subprocess.Popen([sys.executable, "-c", _TWO_PROCESSES, str(i), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for out in outs:
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT")]
        assert line, out[-3000:]
        xla, got = line[0].split(" ", 2)[2].split(") (")
        xla = [float(v) for v in xla.strip("() ").split(",")]
        got = [float(v) for v in got.strip("() ").split(",")]
        np.testing.assert_allclose(got, xla, rtol=1e-5)


def test_auto_transport_falls_back_with_one_warning(monkeypatch):
    """JAX_MOK_TRANSPORT=auto on CPU: the XLA transport's result, one warning with the reason;
    a value outside auto | xla | peer is an error naming the variable."""
    import warnings

    devices = jax.devices("cpu")
    if len(devices) < 2:
        pytest.skip("needs 2 CPU devices")
    mesh = jax.sharding.Mesh(np.array(devices[:2]), ("expert",))
    config = _config()
    params = testing.random_params(jax.random.key(0), config)
    x = jax.random.normal(jax.random.key(1), (16, 64))

    def call(x, params):
        # A fresh jit per call: every call traces (resolves its transport) as an eager call
        # does, but compiles one program instead of dispatching ~200 ops one by one (an eager
        # expert-parallel call recompiles them all every time: ~14 s a call on 2 CPU cores).
        return jax.jit(lambda x, p: jax_mok.moe(x, p, mesh=mesh))(x, params)

    want = call(x, params)
    monkeypatch.setenv("JAX_MOK_TRANSPORT", "auto")
    monkeypatch.setattr(plan, "_WARNED", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = call(x, params)
        call(x, params)
    texts = [str(w.message) for w in caught if "transport 'auto'" in str(w.message)]
    assert len(texts) == 1 and "uses 'xla'" in texts[0], texts
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    monkeypatch.setenv("JAX_MOK_TRANSPORT", "nvls")
    with pytest.raises(ValueError, match=r"JAX_MOK_TRANSPORT='nvls' is not accepted; it takes "
                                         r"auto \| xla \| peer"):
        call(x, params)


def test_info_says_which_transport_auto_picks():
    """``python -m jax_mok info`` names the expert-parallel transport ``auto`` would pick over
    every device, with the reason (on CPU devices: "xla", because they are not CUDA GPUs, or,
    where the CUDA extension is not built, because of that: it is checked first)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "jax_mok", "info"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [ln for ln in proc.stdout.splitlines() if "expert parallelism" in ln]
    from jax_mok.kernels import _ffi

    reason = "not a CUDA GPU" if _ffi.kernels_built("cuda") else "is not built"
    assert line and "transport 'xla'" in line[0] and reason in line[0], proc.stdout
