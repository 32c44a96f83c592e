"""Shared by the multi-device tests on the CPU: the CPU devices they ask for, meshes over them,
and the peer transport faked so that its calls lower there."""

from __future__ import annotations

import math
import os

import jax
import pytest
from jax.sharding import AxisType

from jax_mok.ep import workspace

CPU_DEVICES = 8


def request() -> None:
    """Asks for :data:`CPU_DEVICES` CPU devices: call at a test module's import, before the CPU
    backend exists (a device count in ``XLA_FLAGS`` wins). Where the backend exists already,
    :func:`devices` skips with the reason."""
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        try:
            jax.config.update("jax_num_cpu_devices", CPU_DEVICES)
        except RuntimeError:
            pass


def devices(n: int) -> list:
    """The first ``n`` CPU devices; skips the test when there are fewer."""
    found = jax.devices("cpu")
    if len(found) < n:
        pytest.skip(
            f"needs {n} CPU devices, have {len(found)}: the CPU backend was created before the "
            "test module could set jax_num_cpu_devices; run with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={CPU_DEVICES}")
    return found[:n]


def mesh(shape: tuple[int, ...], names: tuple[str, ...], axis_type=AxisType.Explicit):
    """``jax.make_mesh`` over the first CPU devices, every axis of ``axis_type``."""
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(names),
                         devices=devices(math.prod(shape)))


def fake_peer(monkeypatch) -> None:
    """Transport ``"peer"`` available on any mesh, with a dummy workspace handle: its calls
    lower (and run on the CPU through the host exchange) without a GPU."""
    monkeypatch.setattr(workspace, "peer_transport_available", lambda mesh, axis: (True, "fake"))
    monkeypatch.setattr(workspace, "workspace_for", lambda mesh, axis, spec, *a, **kw: 7)
