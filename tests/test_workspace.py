"""jax_mok.ep.workspace on the CPU: sizing, error messages, selection reasons, fingerprints."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

import jax_mok
from jax_mok import testing
from jax_mok.ep import workspace
from jax_mok.ep.workspace import WorkspaceSpec


def _config(**kw):
    base = {"num_experts": 8, "top_k": 2, "hidden_size": 32, "ffn_size": 16}
    return jax_mok.MoEConfig(**{**base, **kw})


def test_sizes_follow_the_formulas():
    spec = WorkspaceSpec(ep_size=2, rows=8192, hidden_size=7168, top_k=8, dtype="bfloat16")
    x_bytes = 8192 * 7168 * 2
    meta = 8192 * 8 * 4
    assert spec.dispatch_chunk_bytes == x_bytes + 2 * meta
    assert spec.combine_chunk_bytes == x_bytes
    assert spec.chunk_bytes == spec.dispatch_chunk_bytes
    assert spec.total_bytes == 4096 + 4 * 2 * spec.chunk_bytes  # 4 areas x EP=2 regions
    odd = WorkspaceSpec(ep_size=3, rows=3, hidden_size=5, top_k=1, dtype="float32")
    assert odd.dispatch_chunk_bytes == 64 + 16 + 16  # every field padded to 16 bytes
    assert odd.dispatch_chunk_bytes % 16 == 0


def test_for_call_rows_dropless_and_capacity():
    dropless = WorkspaceSpec.for_call(_config(), 64, 256, 4, jnp.bfloat16)
    assert dropless.rows == 64 and dropless.dtype == "bfloat16" and dropless.ep_size == 4
    capped = WorkspaceSpec.for_call(_config(capacity_factor=0.5), 64, 256, 4, jnp.float32)
    # C = ceil(0.5 * 256 * 2 / 8) = 32 per expert, 2 local experts -> R = min(64, 64)
    assert capped.rows == 64
    capped = WorkspaceSpec.for_call(_config(capacity_factor=0.125), 64, 256, 4, jnp.float32)
    assert capped.rows == 16  # C = 8, 2 local experts


def test_spec_errors_name_the_values():
    with pytest.raises(ValueError, match=r"ep_size must be <= 64 .* got 65"):
        WorkspaceSpec(65, 1, 8, 1, "bfloat16")
    with pytest.raises(ValueError, match=r"rows must be a positive int, got 0"):
        WorkspaceSpec(2, 0, 8, 1, "bfloat16")
    with pytest.raises(ValueError, match=r"dtype must be 'bfloat16' or 'float32', got 'int8'"):
        WorkspaceSpec(2, 1, 8, 1, "int8")
    spec = WorkspaceSpec(2, 8192, 7168, 8, "bfloat16")
    with pytest.raises(ValueError, match=r"(?s)943\d+ bytes per GPU.*EP=2.*R=8192.*H=7168.*"
                                         r"k=8.*bfloat16.*limit of 1000000 bytes"):
        spec.check_fits(1_000_000)
    spec.check_fits(1 << 30)


@pytest.mark.parametrize("how", ["argument", "env"])
def test_limit_from_the_tuning(monkeypatch, how):
    """PeerTuning.workspace_limit_bytes (argument, or JAX_MOK_TUNING) reaches the workspace's
    size check of a moe call (availability faked: the check comes before any allocation)."""
    monkeypatch.setattr(workspace, "peer_transport_available", lambda mesh, axis: (True, "fake"))
    mesh = jax.sharding.Mesh(jax.devices("cpu")[:1], ("expert",))
    params = testing.random_params(jax.random.key(0), _config())
    kw = {}
    if how == "argument":
        kw["tuning"] = jax_mok.Tuning(peer=jax_mok.PeerTuning(workspace_limit_bytes=1024))
    else:
        monkeypatch.setenv("JAX_MOK_TUNING", "workspace_limit_bytes=1024")
    with pytest.raises(ValueError, match="limit of 1024 bytes"):
        jax_mok.moe(jnp.ones((8, 32)), params, mesh=mesh, transport="peer", **kw)


class _Constants:
    def __init__(self, **values):
        self.values = values

    def workspace_constants(self):
        return self.values


def test_extension_constants_must_agree():
    """The CUDA extension's workspace_constants() against this module's sizes, by name."""
    workspace.check_extension_constants(object())  # an extension without the report: nothing
    workspace.check_extension_constants(_Constants(kSignalBytes=workspace.SIGNAL_BYTES,
                                                   kMaxRanks=workspace.MAX_EP,
                                                   kAreas=workspace.AREAS, kOther=3))
    with pytest.raises(RuntimeError, match=r"areas: Python 4, extension 5"):
        workspace.check_extension_constants(_Constants(signal_bytes=4096, areas=5))
    with pytest.raises(RuntimeError, match="name none of"):
        workspace.check_extension_constants(_Constants(unrelated=1))


def test_fingerprint_mismatch_names_fields():
    spec = WorkspaceSpec(2, 64, 32, 2, "float32")
    a = workspace.fingerprint(spec, _config(), {"expert": 2}, "expert")
    workspace.compare_fingerprints(a, dict(a), 0, 1)
    other = dataclasses.replace(spec, rows=32)
    b = workspace.fingerprint(other, _config(top_k=3), {"expert": 2}, "expert")
    with pytest.raises(ValueError) as info:
        workspace.compare_fingerprints(a, b, 0, 1)
    text = str(info.value)
    assert "spec.rows: rank 0 has 64, rank 1 has 32" in text
    assert "config.top_k: rank 0 has 2, rank 1 has 3" in text
    assert "hidden_size" not in text


class _FakeKV:
    def __init__(self, store):
        self.store = store

    def key_value_set(self, key, value):
        self.store[key] = value

    def blocking_key_value_get(self, key, timeout_ms):
        return self.store[key]


def test_exchange_fingerprint_through_a_kv_store():
    store = {}
    spec = WorkspaceSpec(2, 64, 32, 2, "float32")
    fp0 = workspace.fingerprint(spec, _config())
    fp1 = workspace.fingerprint(spec, _config(hidden_size=64))
    store["k/1"] = '{"stale": 1}'
    workspace.exchange_fingerprint(fp0, "k", 0, 1, client=_FakeKV(store))  # 1 process: no-op
    assert "k/0" not in store
    _FakeKV(store).key_value_set("k/1", __import__("json").dumps(fp1))
    with pytest.raises(ValueError, match=r"config.hidden_size: rank 0 has 32, rank 1 has 64"):
        workspace.exchange_fingerprint(fp0, "k", 0, 2, client=_FakeKV(store))


def test_unavailable_on_cpu_with_reason():
    devices = jax.devices("cpu")[:1]
    mesh = jax.sharding.Mesh(devices, ("expert",))
    ok, reason = workspace.peer_transport_available(mesh, "expert")
    assert not ok
    assert "not built" in reason or "not a CUDA GPU" in reason
    path, why = workspace.bootstrap_path(mesh, "expert")
    assert path == "peer_access" and "one process" in why
    abstract = jax.sharding.AbstractMesh((1,), ("expert",))
    ok, reason = workspace.peer_transport_available(abstract, "expert")
    assert not ok and reason


def test_peer_transport_raises_on_cpu_like_before():
    config = _config()
    params = testing.random_params(jax.random.key(0), config)
    mesh = jax.sharding.Mesh(jax.devices("cpu")[:1], ("expert",))
    with pytest.raises(NotImplementedError, match=r"transport='peer'"):
        jax_mok.moe(jnp.ones((8, 32)), params, mesh=mesh, transport="peer")


_TWO_PROCESS = textwrap.dedent("""
    import sys, jax
    pid, port, hidden = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    import jax_mok
    from jax_mok.ep import workspace
    cfg = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=hidden, ffn_size=16)
    spec = workspace.WorkspaceSpec.for_call(cfg, 64, 128, 2, "float32")
    try:
        workspace.exchange_fingerprint(workspace.fingerprint(spec, cfg), "t", pid, 2,
                                       timeout_ms=20000)
        print("AGREE", flush=True)
    except ValueError as e:
        print("MISMATCH", e, flush=True)
    jax.distributed.shutdown()
""")


@pytest.mark.slow
def test_two_processes_detect_mismatch(tmp_path):
    """Two CPU processes through jax.distributed's key-value store: rank 1 has another H."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "fp.py"
    script.write_text(_TWO_PROCESS)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(port), str(32 + 32 * i)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env) for i in range(2)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    for out in outs:
        assert "MISMATCH" in out and "config.hidden_size" in out, out[-2000:]


def test_bootstrap_path_for_several_processes(monkeypatch):
    """Selection logic with fake devices of two processes (nothing is allocated)."""

    class Dev:
        def __init__(self, i, process):
            self.id, self.process_index, self.local_hardware_id = i, process, 0

    mesh = jax.sharding.Mesh(jax.devices("cpu")[:1], ("expert",))
    monkeypatch.setattr(workspace, "_groups", lambda mesh, axis: [[Dev(0, 0), Dev(1, 1)]])
    monkeypatch.setattr(workspace, "_cuda", lambda: None)
    monkeypatch.delenv("JAX_MOK_PEER_BOOTSTRAP", raising=False)
    assert workspace.bootstrap_path(mesh, "expert", hosts=1)[0] == "ipc"
    path, why = workspace.bootstrap_path(mesh, "expert", hosts=2)
    assert path is None and "2 hosts" in why and "fabric" in why
    assert workspace.bootstrap_path(mesh, "expert")[0] == "ipc"  # hosts unknown
    monkeypatch.setenv("JAX_MOK_PEER_BOOTSTRAP", "fabric")
    assert workspace.bootstrap_path(mesh, "expert", hosts=1) == (
        "fabric", "JAX_MOK_PEER_BOOTSTRAP=fabric")


class _FakeModule:
    """Records the bootstrap calls workspace_for makes (no GPU)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if not name.startswith("workspace_"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, *args))
            return b"I" + bytes(72) if name == "workspace_export" else None

        return call


class _Dev:
    def __init__(self, i, process, ordinal):
        self.id, self.process_index, self.local_hardware_id = i, process, ordinal


def _fake_bootstrap(monkeypatch, groups, processes=1, store=None):
    fake = _FakeModule()
    monkeypatch.setattr(workspace, "_cuda", lambda: fake)
    monkeypatch.setattr(workspace, "_groups", lambda mesh, axis: groups)
    monkeypatch.setattr(workspace, "peer_transport_available", lambda mesh, axis: (True, "fake"))
    monkeypatch.setattr(jax, "process_count", lambda: processes)
    monkeypatch.setattr(workspace, "kv_client", lambda: _FakeKV(store) if processes > 1 else None)
    monkeypatch.delenv("JAX_MOK_PEER_BOOTSTRAP", raising=False)
    monkeypatch.setattr(workspace, "_WORKSPACES", {})
    monkeypatch.setattr(workspace, "_GENERATION", [0])
    mesh = jax.sharding.Mesh(jax.devices("cpu")[:1], ("expert",))
    spec = WorkspaceSpec(2, 8, 16, 2, "float32")
    return fake, workspace.workspace_for(mesh, "expert", spec)


def test_workspace_for_single_process_links_raw_pointers(monkeypatch):
    groups = [[_Dev(0, 0, 0), _Dev(1, 0, 1)], [_Dev(2, 0, 2), _Dev(3, 0, 3)]]
    fake, ws = _fake_bootstrap(monkeypatch, groups)
    names = [c[0] for c in fake.calls]
    assert names.count("workspace_alloc") == 4 and "workspace_export" not in names
    assert ("workspace_link_local", ws, 0, 1, 1) in fake.calls
    assert ("workspace_link_local", ws, 3, 0, 2) in fake.calls
    assert names.count("workspace_finalize") == 4
    spec_bytes = WorkspaceSpec(2, 8, 16, 2, "float32").total_bytes
    assert ("workspace_alloc", ws, 2, 0, 2, spec_bytes, False) in fake.calls


def test_workspace_for_two_processes_exchanges_handles(monkeypatch):
    """Process 0 of 2 (one GPU each): exports its handle, opens the peer's from the KV store,
    after the host-name and fingerprint exchange."""
    import json
    import socket

    groups = [[_Dev(0, 0, 0), _Dev(1, 1, 0)]]
    store = {}
    spec = WorkspaceSpec(2, 8, 16, 2, "float32")
    key = ((0, 1), "expert", spec)
    ws_guess = __import__("zlib").crc32(repr((key, 0)).encode()) & 0x7FFFFFFF
    store[f"jax_mok/host/{ws_guess}/1"] = socket.gethostname()
    fp = workspace.fingerprint(spec, None, {"expert": 1}, "expert")
    fp["workspace_id"], fp["bootstrap"] = ws_guess, "ipc"
    store[f"jax_mok/fp/{ws_guess}/1"] = json.dumps(fp)
    store[f"jax_mok/ws/{ws_guess}/0/1"] = (b"I" + bytes(72)).hex()
    fake, ws = _fake_bootstrap(monkeypatch, groups, processes=2, store=store)
    assert ws == ws_guess
    names = [c[0] for c in fake.calls]
    assert names == ["workspace_alloc", "workspace_export", "workspace_open_peer",
                     "workspace_finalize"]
    assert store[f"jax_mok/ws/{ws}/0/0"] == (b"I" + bytes(72)).hex()


def test_reset_frees_and_next_bootstrap_gets_a_fresh_id(monkeypatch):
    groups = [[_Dev(0, 0, 0), _Dev(1, 0, 1)]]
    fake, first = _fake_bootstrap(monkeypatch, groups)
    mesh = jax.sharding.Mesh(jax.devices("cpu")[:1], ("expert",))
    spec = WorkspaceSpec(2, 8, 16, 2, "float32")
    assert workspace.workspace_for(mesh, "expert", spec) == first  # cached
    workspace.reset()
    assert ("workspace_free_all",) in fake.calls
    assert workspace.workspace_for(mesh, "expert", spec) != first
