"""jax_mok.tuning: the tuning dataclasses, JAX_MOK_TUNING, the env registry, and the tuning
attributes every kernel and peer call carries (checked in the lowered program: no GPU needed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import cpu_devices
import jax
import numpy as np
import pytest

import jax_mok
from jax_mok import testing, tuning
from jax_mok.kernels import targets
from jax_mok.tuning import KernelTuning, PeerTuning, Tuning

cpu_devices.request()


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for name in list(os.environ):
        if name.startswith("JAX_MOK_") and name != "JAX_MOK_REQUIRE_CUDA":
            monkeypatch.delenv(name)


@pytest.mark.parametrize("make,message", [
    (lambda: KernelTuning(pregather_x=1), r"KernelTuning.pregather_x must be None, True or False"),
    (lambda: KernelTuning(pregather_backward="auto"),
     r"KernelTuning.pregather_backward must be None, True or False, got 'auto'"),
    (lambda: KernelTuning(gemm="wgmma"), r"KernelTuning.gemm must be one of \('auto', 'simt'\)"),
    (lambda: PeerTuning(copy="dma"), r"PeerTuning.copy must be one of \('ce', 'sm'\)"),
    (lambda: PeerTuning(check="never"), r"PeerTuning.check must be one of"),
    (lambda: PeerTuning(timeout_ms=0), r"PeerTuning.timeout_ms must be an int >= 1, got 0"),
    (lambda: PeerTuning(ctas_per_sm=5), r"PeerTuning.ctas_per_sm must be an int in \[1, 4\]"),
    (lambda: PeerTuning(workspace_limit_bytes=1.5), r"workspace_limit_bytes must be an int"),
    (lambda: Tuning(kernel=PeerTuning()), r"Tuning.kernel must be a KernelTuning"),
])
def test_fields_are_validated(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_pregather_heuristic():
    """On for F >= 4096, or F >= 2048 with >= 512 rows per expert on average; forced otherwise."""
    cases = {(768, 4096): False, (14336, 1): True, (4096, 0): True, (2048, 512): True,
             (2048, 511): False, (3072, 112): False}
    for (ffn, rows), want in cases.items():
        assert tuning.pregather_heuristic(ffn, rows) is want, (ffn, rows)
    assert KernelTuning().pregather_for(2048, 512 * 32, 32) is True
    assert KernelTuning().pregather_for(2048, 511 * 32, 32) is False
    assert KernelTuning(pregather_x=False).pregather_for(14336, 10**6, 8) is False
    assert KernelTuning(pregather_x=True).pregather_for(768, 8, 8) is True


def test_pregather_backward_heuristic():
    """The backward copies x and dy for F >= 2048 (S2-S6), not below (S1); each choice is its own
    field: the forward's never decides the backward's."""
    for ffn, want in {768: False, 2047: False, 2048: True, 14336: True}.items():
        assert tuning.pregather_backward_heuristic(ffn) is want, ffn
        assert KernelTuning().pregather_for(ffn, 8, 8, backward=True) is want, ffn
    assert KernelTuning(pregather_x=True).pregather_for(768, 8, 8, backward=True) is False
    assert KernelTuning(pregather_backward=True).pregather_for(768, 8, 8, backward=True) is True
    assert KernelTuning(pregather_backward=False).pregather_for(4096, 8, 8) is True
    assert tuning.parse_tuning("pregather_backward=0") == {"pregather_backward": False}


def test_parse_tuning_is_strict():
    assert tuning.parse_tuning("pregather_x=1, copy=sm,timeout_ms=2000,") == {
        "pregather_x": True, "copy": "sm", "timeout_ms": 2000}
    assert tuning.parse_tuning("pregather_x=auto")["pregather_x"] is None
    for text, message in [
        ("colour=red", r"JAX_MOK_TUNING: unknown key 'colour'; keys: \["),
        ("copy", r"'copy' is not key=value"),
        ("copy=sm,copy=ce", r"key 'copy' is given twice"),
        ("copy=fast", r"copy='fast' is not accepted; copy takes ce \| sm"),
        ("pregather_x=true", r"pregather_x='true' is not accepted; pregather_x takes auto \| 0"),
        ("ctas_per_sm=9", r"ctas_per_sm takes an integer in 1..4"),
        ("timeout_ms=-5", r"timeout_ms takes an integer >= 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            tuning.parse_tuning(text)


def test_resolution_order_default_env_argument(monkeypatch):
    resolved, sources = tuning.resolve_with_sources()
    assert resolved == Tuning() and set(sources.values()) == {"default"}
    monkeypatch.setenv("JAX_MOK_TUNING", "copy=sm,gemm=simt,timeout_ms=2000")
    argument = Tuning(kernel=KernelTuning(pregather_x=True), peer=PeerTuning(timeout_ms=500))
    resolved, sources = tuning.resolve_with_sources(argument)
    assert resolved == Tuning(KernelTuning(pregather_x=True, gemm="simt"),
                              PeerTuning(copy="sm", timeout_ms=500))
    assert sources["kernel.pregather_x"] == "argument" and sources["peer.timeout_ms"] == "argument"
    assert sources["peer.copy"] == "env" and sources["kernel.gemm"] == "env"
    assert sources["peer.check"] == "default"
    assert tuning.resolve(tuning.resolve(argument)) == resolved  # idempotent
    with pytest.raises(TypeError, match="tuning must be a jax_mok.Tuning or None"):
        tuning.resolve({"copy": "sm"})


@pytest.mark.parametrize("name,value,message", [
    ("JAX_MOK_REQUIRE_CUDA", "false", r"JAX_MOK_REQUIRE_CUDA='false' is not accepted; it takes 0 "
                                      r"\| 1"),
    ("JAX_MOK_CUDA_PROFILE", "yes", r"it takes 0 \| 1"),
    ("JAX_MOK_TRANSPORT", "nccl", r"it takes auto \| xla \| peer"),
    ("JAX_MOK_PEER_BOOTSTRAP", "IPC", r"it takes ipc \| fabric"),
    ("JAX_MOK_CPU_THREADS", "0", r"it takes an integer >= 1"),
    ("JAX_MOK_TUNING", "copy=sm;check=sync", r"JAX_MOK_TUNING: copy='sm;check=sync'"),
])
def test_registry_parses_strictly(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        tuning.read(name)


def test_registry_values_and_unknown_names(monkeypatch):
    assert tuning.read("JAX_MOK_TRANSPORT") is None  # unset
    monkeypatch.setenv("JAX_MOK_CPU_THREADS", "3")
    monkeypatch.setenv("JAX_MOK_CUDA_DEBUG_SYNC", "1")
    monkeypatch.setenv("JAX_MOK_TRANSPORT", "")  # empty: unset
    assert tuning.read("JAX_MOK_CPU_THREADS") == 3
    assert tuning.read("JAX_MOK_CUDA_DEBUG_SYNC") is True
    assert tuning.read("JAX_MOK_TRANSPORT") is None
    with pytest.raises(ValueError, match="JAX_MOK_NOPE is not a jax_mok environment variable"):
        tuning.read("JAX_MOK_NOPE")
    for var in tuning.REGISTRY.values():
        assert var.role in ("library", "debug", "build", "test", "bench"), var
        assert var.accepted and var.default and var.meaning and var.reader, var
    # A removed switch still set is named once, not silently ignored.
    monkeypatch.setenv("JAX_MOK_PEER_FUSED", "0")
    monkeypatch.setattr(tuning, "_WARNED_UNKNOWN", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuning.resolve()
        tuning.resolve()
    texts = [str(w.message) for w in caught if "JAX_MOK_PEER_FUSED" in str(w.message)]
    assert len(texts) == 1 and "not a jax_mok setting" in texts[0], texts


def test_attributes_follow_the_contract(monkeypatch):
    """The attribute names, types and values of every target group (docs/ffi-contract.md)."""
    monkeypatch.setattr(targets, "_ATTRIBUTES_BOUND", True)
    kernel = KernelTuning(gemm="simt")
    peer = PeerTuning(copy="sm", check="deferred", timeout_ms=1234, ctas_per_sm=3)
    local = targets.attributes("mok_moe_bwd_saved", kernel=kernel, ffn_size=4096,
                               assignments=64, num_experts=8)
    assert local == {"pregather_x": 1, "gemm": 1}
    assert {k: type(v) for k, v in local.items()} == {"pregather_x": np.int32, "gemm": np.int32}
    staged = targets.attributes("mok_ep_combine", peer=peer)
    assert staged == {"copy_engine": 0, "sync_check": 0, "timeout_ms": 1234, "ctas_per_sm": 3}
    assert type(staged["timeout_ms"]) is np.int64 and type(staged["copy_engine"]) is np.int32
    fused = targets.attributes("mok_ep_moe_fwd_train", kernel=KernelTuning(), peer=PeerTuning(),
                               ffn_size=768, assignments=8192 * 8, num_experts=64)
    assert fused == {"pregather_x": 0, "gemm": 0, "copy_engine": 1, "sync_check": 1,
                     "timeout_ms": 10_000, "ctas_per_sm": 2}
    # A backward target's pregather_x is the backward's choice: S2's forward keeps x in token
    # order (256 rows per expert), its backward copies x and dy (F = 2048); S1 the reverse of
    # neither.
    s2 = dict(ffn_size=2048, assignments=8192 * 8, num_experts=256)
    for target in targets.KERNEL_TARGETS + targets.FUSED_PEER_TARGETS:
        want = target in targets.BACKWARD_TARGETS
        got = targets.attributes(target, kernel=KernelTuning(), peer=PeerTuning(), **s2)
        assert got["pregather_x"] == want, target
    assert targets.attributes("mok_moe_bwd", kernel=KernelTuning(pregather_backward=False),
                              **s2)["pregather_x"] == 0
    with pytest.raises(ValueError, match="'mok_home_sum' takes no tuning attributes"):
        targets.attributes("mok_home_sum")
    with pytest.raises(ValueError, match="'mok_ep_moe_bwd' needs KernelTuning PeerTuning"):
        targets.attributes("mok_ep_moe_bwd", kernel=kernel)
    monkeypatch.setattr(targets, "_ATTRIBUTES_BOUND", False)
    assert targets.attributes("mok_moe_fwd", kernel=kernel) == {}


def _custom_calls(text: str) -> dict[str, list[str]]:
    """Target -> the attribute dict text of each of its custom calls in a lowered program."""
    out: dict[str, list[str]] = {}
    for name, attrs in re.findall(r"custom_call @(\w+)\(.*?mhlo.backend_config = \{([^}]*)\}",
                                  text):
        out.setdefault(name, []).append(attrs)
    return out


def test_tuning_reaches_the_lowered_program(monkeypatch):
    """jax_mok.moe's tuning= lands in every custom call as attributes (so in the jit cache key),
    for the local kernels and for the fused peer calls (availability faked; nothing runs)."""
    monkeypatch.setattr(targets, "_ATTRIBUTES_BOUND", True)
    config = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=64, ffn_size=32)
    params = testing.random_params(jax.random.key(0), config)
    x = jax.random.normal(jax.random.key(1), (16, 64))
    tuned = Tuning(kernel=KernelTuning(pregather_x=True, pregather_backward=True, gemm="simt"),
                   peer=PeerTuning(copy="sm", timeout_ms=2000))

    def lowered(**kw):
        step = jax.grad(lambda x: (jax_mok.moe(x, params, implementation="ffi", **kw) ** 2).sum())
        return jax.jit(step).lower(x).as_text()

    calls = _custom_calls(lowered(tuning=tuned))
    assert sorted(calls) == ["mok_moe_bwd", "mok_moe_fwd"], sorted(calls)
    for attrs in calls["mok_moe_fwd"] + calls["mok_moe_bwd"]:
        assert "gemm = 1 : i32" in attrs and "pregather_x = 1 : i32" in attrs, attrs
    default = _custom_calls(lowered())["mok_moe_fwd"][0]
    assert "gemm = 0 : i32" in default and "pregather_x = 0 : i32" in default, default
    # the backward's own field, not the forward's
    one = _custom_calls(lowered(tuning=Tuning(kernel=KernelTuning(pregather_x=True))))
    assert "pregather_x = 1 : i32" in one["mok_moe_fwd"][0], one
    assert "pregather_x = 0 : i32" in one["mok_moe_bwd"][0], one
    monkeypatch.setenv("JAX_MOK_TUNING", "gemm=simt")
    assert "gemm = 1 : i32" in _custom_calls(lowered())["mok_moe_fwd"][0]
    monkeypatch.delenv("JAX_MOK_TUNING")

    cpu_devices.fake_peer(monkeypatch)
    mesh = jax.sharding.Mesh(np.array(cpu_devices.devices(2)), ("expert",))
    step = jax.grad(lambda x: (jax_mok.moe(x, params, mesh=mesh, transport="peer",
                                           tuning=tuned) ** 2).sum())
    calls = _custom_calls(jax.jit(step).lower(x).as_text())
    # On the CPU the residual policy recomputes h: the h-less variants of the two fused calls.
    assert sorted(calls) == ["mok_ep_moe_bwd_recompute", "mok_ep_moe_fwd_train_recompute"], sorted(
        calls)
    for attrs in calls["mok_ep_moe_bwd_recompute"] + calls["mok_ep_moe_fwd_train_recompute"]:
        for want in ("copy_engine = 0 : i32", "sync_check = 1 : i32", "timeout_ms = 2000 : i64",
                     "ctas_per_sm = 2 : i32", "gemm = 1 : i32", "pregather_x = 1 : i32",
                     "workspace_id = 7 : i64"):
            assert want in attrs, (want, attrs)


def test_info_prints_every_setting_with_its_source():
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_MOK_")}
    env.update(JAX_PLATFORMS="cpu", JAX_MOK_TUNING="copy=sm", JAX_MOK_CPU_THREADS="2",
               JAX_MOK_PEER_UNROLL="4")
    proc = subprocess.run([sys.executable, "-m", "jax_mok", "info"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = {ln.split()[0]: ln for ln in proc.stdout.splitlines()
             if ln.strip().startswith(("tuning.", "JAX_MOK_"))}
    assert set(tuning.REGISTRY) <= set(lines), sorted(lines)
    # Columns: setting, value, source, kind.
    assert lines["tuning.peer.copy"].split()[1:3] == ["'sm'", "env"]
    assert lines["tuning.peer.check"].split()[2] == "default"
    assert lines["JAX_MOK_CPU_THREADS"].split()[1:3] == ["2", "env"]
    assert "ignored" in proc.stdout and "JAX_MOK_PEER_UNROLL" in proc.stdout
