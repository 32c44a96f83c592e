"""The deferred check's error reporting (jax_mok/ep/errors.py): on demand, by the watchdog, and
(GPU) by the next peer call. The CPU tests stand in for the extension's error list with a fake;
the GPU test runs issue 18's sequence with check="deferred"."""

from __future__ import annotations

import logging
import time

import jax
import jax.numpy as jnp
import pytest

import jax_mok
from jax_mok import sharding, testing
from jax_mok.ep import errors, workspace
from jax_mok.kernels import _ffi

MESSAGE = ("jax_mok peer transport: rank 0 (device 0) timed out waiting for rank 1 in phase "
           "reverse dispatch (workspace 7): that rank never ran the matching call.")


class _FakeModule:
    def __init__(self, messages):
        self.messages = messages

    def peer_errors(self):
        return list(self.messages)


@pytest.fixture
def fake(monkeypatch):
    module = _FakeModule([])
    monkeypatch.setattr(_ffi, "cuda_module", lambda: module)
    return module


def test_no_extension_or_no_workspace_means_no_errors(monkeypatch):
    monkeypatch.setattr(_ffi, "cuda_module", lambda: None)
    assert errors.peer_errors() == []
    errors.check_peer()  # nothing to raise


def test_built_extension_lists_nothing_without_workspaces():
    """The real extension (when built; CI builds it with nvcc): an empty registry, no GPU
    needed, no error."""
    module = _ffi.cuda_module()
    if module is None:
        pytest.skip("the CUDA extension is not built")
    assert hasattr(module, "peer_errors"), "the CUDA extension lacks peer_errors"
    if jax.devices()[0].platform == "cpu":  # no GPU: no workspace can exist
        assert errors.peer_errors() == []


def test_check_peer_raises_every_message(fake):
    fake.messages = [MESSAGE, MESSAGE.replace("rank 0 (device 0)", "rank 1 (device 1)")]
    assert sharding.peer_errors() == fake.messages
    with pytest.raises(RuntimeError, match="2 error") as info:
        sharding.check_peer()
    assert "rank 1 (device 1)" in str(info.value) and "reset()" in str(info.value)


def test_watchdog_logs_each_error_once(fake, caplog):
    dog = errors._Watchdog()
    with caplog.at_level(logging.ERROR, logger="jax_mok"):
        assert dog.poll() == []
        fake.messages = [MESSAGE]
        assert dog.poll() == [MESSAGE]
        assert dog.poll() == []  # seen: not logged again
    assert [r.getMessage() for r in caplog.records] == [MESSAGE]


def test_watchdog_thread_reports_without_any_call(fake, caplog, monkeypatch):
    """The thread finds an error no call asked about, within a few polls, and stops cleanly."""
    monkeypatch.setattr(errors, "POLL_SECONDS", 0.01)
    dog = errors._Watchdog()
    with caplog.at_level(logging.ERROR, logger="jax_mok"):
        dog.start()
        dog.start()  # idempotent: one thread
        assert dog.running()
        fake.messages = [MESSAGE]
        deadline = time.monotonic() + 5.0
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
        dog.stop()
    assert not dog.running()
    assert [r.getMessage() for r in caplog.records] == [MESSAGE]


def test_watchdog_reports_its_own_failure(monkeypatch, caplog):
    def broken():
        raise OSError("boom")

    monkeypatch.setattr(errors, "peer_errors", broken)
    monkeypatch.setattr(errors, "POLL_SECONDS", 0.01)
    dog = errors._Watchdog()
    with caplog.at_level(logging.ERROR, logger="jax_mok"):
        dog.start()
        deadline = time.monotonic() + 5.0
        while dog.running() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert not dog.running()
    assert "watchdog stopped" in caplog.records[-1].getMessage()


@pytest.mark.multigpu
def test_deferred_check_never_loses_an_error():
    """Issue 18's sequence (a float32 step on one GPU, then the same step expert-parallel with
    transport="peer") with ``PeerTuning(check="deferred")``: either every value is right, or
    the error is reported by check_peer() and by the next peer call. A wrong result with no
    error anywhere is what this test rejects."""
    config = jax_mok.MoEConfig(num_experts=16, top_k=4, hidden_size=512, ffn_size=256)
    params = testing.random_params(jax.random.key(3), config, jnp.float32)
    x = jax.random.normal(jax.random.key(4), (2048, 512), jnp.float32)
    c = jax.random.normal(jax.random.key(5), (2048, 512), jnp.float32)
    deferred = jax_mok.Tuning(peer=jax_mok.PeerTuning(check="deferred"))

    def loss(x, p, **kw):
        return jnp.sum(jax_mok.moe(x, p, **kw) * c)

    v0, (dx0, dp0) = jax.block_until_ready(
        jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, params))
    devices = jax.devices("gpu")[:2]
    mesh = jax.sharding.Mesh(devices, ("expert",))
    placed = jax.device_put(params, sharding.param_shardings(params, mesh))
    step = jax.jit(jax.value_and_grad(
        lambda x, p: loss(x, p, mesh=mesh, transport="peer", tuning=deferred), argnums=(0, 1)))
    try:
        v1, (dx1, dp1) = jax.block_until_ready(step(x, placed))
        time.sleep(0.2)  # a kernel's error word is written before its stream completes
        reported = sharding.peer_errors()
        tol = testing.tolerance(jnp.float32)
        right = (abs(float(v1) - float(v0)) <= tol * abs(float(v0))
                 and testing.rel_error(dx1, dx0) < tol
                 and all(testing.rel_error(g, w) < tol for w, g in
                         zip(jax.tree.leaves(dp0), jax.tree.leaves(dp1), strict=True)))
        if not right:
            assert reported, "a wrong result and no error: the deferred check lost it"
        if reported:
            with pytest.raises(RuntimeError, match="timed out|exchange count"):
                sharding.check_peer()
            with pytest.raises(Exception, match="earlier peer call failed|unusable"):
                jax.block_until_ready(step(x, placed))
    finally:
        workspace.reset()
