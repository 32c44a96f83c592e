"""The CUDA kernels run on compute capability 9.x only (built for sm_90a): on any other GPU the
default implementation is the reference, decided at trace time with a one-time warning, and an
explicit ``"cuda"`` raises at trace time. No GPU here: the default backend, the extension and the
capability are faked (nothing below reaches a CUDA lowering)."""

from __future__ import annotations

import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mok
import jax_mok.warn
from jax_mok import __main__ as cli
from jax_mok import api, testing
from jax_mok.ep import pack, workspace
from jax_mok.kernels import _ffi, autodiff
from jax_mok.quantization import cuda as kernels_fp8
from jax_mok.quantization import layer as fp8

CONFIG = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=16, ffn_size=8)


@pytest.fixture
def fake_gpu(monkeypatch):
    """``fake_gpu("8.0")``: the default backend is a GPU of that compute capability, the CUDA
    extension is built, and no warning has been given yet."""
    real_built = _ffi.kernels_built

    def fake(capability: str):
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        monkeypatch.setattr(_ffi, "kernels_built",
                            lambda p: True if p in ("gpu", "cuda") else real_built(p))
        monkeypatch.setattr(_ffi, "gpu_capability", lambda: capability)
        monkeypatch.setattr(jax_mok.warn, "_warned", set())

    return fake


def test_no_gpu_here_nothing_to_refuse():
    assert _ffi.gpu_capability() is None
    assert _ffi.cuda_device_limits() is None
    assert _ffi.backends()["cuda_device_limits"] is None


def test_capability_read_from_the_first_gpu_once(monkeypatch):
    real_devices = jax.devices
    calls = []

    def devices(backend=None):
        if backend != "gpu":
            return real_devices(backend)
        calls.append(backend)
        return [types.SimpleNamespace(compute_capability="8.0"),
                types.SimpleNamespace(compute_capability="9.0")]

    monkeypatch.setattr(jax, "devices", devices)
    _ffi.gpu_capability.cache_clear()
    try:
        assert _ffi.gpu_capability() == "8.0" and _ffi.gpu_capability() == "8.0"
        assert len(calls) == 1
        assert "compute capability 8.0" in _ffi.cuda_device_limits()
    finally:
        _ffi.gpu_capability.cache_clear()  # the real answer again for the other tests


@pytest.mark.parametrize("capability", ["8.0", "8.9", "10.0", "12.0"])
def test_other_gpus_default_to_the_reference_warning_once(fake_gpu, capability):
    fake_gpu(capability)
    with pytest.warns(UserWarning) as record:
        assert api.default_implementation() == "reference"
    (warning,) = record
    message = str(warning.message)
    assert f"compute capability {capability}" in message
    assert "built for sm_90a" in message
    assert "pass implementation='reference' to silence this warning" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process (per reason), not per call
        assert api.default_implementation() == "reference"
        assert api.default_implementation(jnp.bfloat16, CONFIG) == "reference"


@pytest.mark.parametrize("capability", ["9.0", "9.1"])
def test_hopper_gets_the_kernels(fake_gpu, capability):
    fake_gpu(capability)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert api.default_implementation() == "ffi"
        assert api.default_implementation(jnp.bfloat16, CONFIG) == "ffi"
    assert api.kernel_limits(jnp.bfloat16, CONFIG, "gpu") is None
    assert kernels_fp8.cuda_limits(128, 128) is None
    autodiff.check_implementation("cuda")  # no error


def test_device_reason_comes_first_and_only_on_gpus(fake_gpu):
    fake_gpu("8.0")
    odd = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=36, ffn_size=20)
    assert "compute capability 8.0" in api.kernel_limits(jnp.float16, odd, "gpu")
    assert api.kernel_limits(jnp.bfloat16, odd, "cpu") is None


def test_moe_default_runs_the_reference(fake_gpu):
    params = jax_mok.init_params(jax.random.key(0), CONFIG, jnp.float32)
    x = jax.random.normal(jax.random.key(1), (8, 16))
    # Jitted (the choice is made at trace time either way): one compile per call instead of
    # the reference's op-by-op dispatch.
    expected = jax.jit(lambda x: jax_mok.moe(x, params, implementation="reference"))(x)
    fake_gpu("8.0")
    with pytest.warns(UserWarning, match="compute capability 8.0"):
        y = jax.jit(lambda x: jax_mok.moe(x, params))(x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(expected))


@pytest.mark.parametrize("implementation", ["cuda", "ffi"])
def test_explicit_kernels_raise_at_trace_time(fake_gpu, implementation):
    params = jax_mok.init_params(jax.random.key(0), CONFIG, jnp.float32)
    x = jnp.ones((8, 16))
    fake_gpu("10.0")
    with pytest.raises(ValueError, match=rf"implementation='{implementation}': this GPU has "
                                         r"compute capability 10\.0 .* sm_90a"):
        jax.jit(lambda x: jax_mok.moe(x, params, implementation=implementation)).trace(x)


def test_explicit_cuda_below_moe_raises(fake_gpu):
    fake_gpu("8.0")
    with pytest.raises(ValueError, match=r"implementation='cuda' but this GPU has compute "
                                         r"capability 8\.0"):
        autodiff.check_implementation("cuda")
    autodiff.check_implementation("ffi")  # lets XLA pick the platform: not refused here


def test_fp8_layer_follows_the_same_rule(fake_gpu):
    E, K, H, F, T = 4, 2, 128, 128, 8
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (T, H))
    ids, weights = testing.random_routing(keys[1], T, E, K)
    w_gate_up = jax.random.normal(keys[2], (E, H, 2 * F)) / np.sqrt(H)
    w_down = jax.random.normal(keys[3], (E, F, H)) / np.sqrt(F)
    args = (x, ids, weights, w_gate_up, w_down, "mxfp8")
    expected = fp8.routed_experts_fp8(*args)
    fake_gpu("8.0")
    assert "compute capability 8.0" in kernels_fp8.cuda_limits(H, F)
    with pytest.warns(UserWarning, match="pure-JAX FP8 layer because this GPU has compute "
                                         "capability 8.0"):
        y = kernels_fp8.routed_experts_fp8(*args, implementation="ffi")
    np.testing.assert_array_equal(np.asarray(y), np.asarray(expected))
    with pytest.raises(ValueError, match="compute capability 8.0"):
        kernels_fp8.routed_experts_fp8(*args, implementation="cuda")


@pytest.mark.parametrize("capability,kernel", [("9.0", True), ("8.0", False)])
def test_home_sum_kernel_only_where_it_runs(fake_gpu, capability, kernel):
    """The XLA transport's combine (every implementation's) lowers to mok_home_sum on CUDA only
    on a GPU the kernels run on."""
    fake_gpu(capability)
    assert pack.home_sum_kernel_applies(jnp.zeros((2, 4, 16), jnp.bfloat16)) == kernel


def test_peer_transport_refused_on_other_gpus(fake_gpu, monkeypatch):
    monkeypatch.setattr(workspace, "_cuda", lambda: types.SimpleNamespace())
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("expert",))
    fake_gpu("8.0")
    ok, reason = workspace.peer_transport_available(mesh, "expert")
    assert not ok and "compute capability 8.0" in reason
    fake_gpu("9.0")
    ok, reason = workspace.peer_transport_available(mesh, "expert")
    assert not ok and "compute capability" not in reason  # the next check: a CPU device


@pytest.mark.parametrize("capability,line", [
    ("9.0", "  on this GPU   : supported"),
    ("8.0", "  on this GPU   : unsupported (this GPU has compute capability 8.0 and the jax_mok "
            "CUDA kernels are built for sm_90a (compute capability 9.x) only): the default "
            "implementation is the reference")])
def test_info_says_whether_this_gpu_runs_the_kernels(fake_gpu, monkeypatch, capability, line):
    real_devices = jax.devices
    gpu = types.SimpleNamespace(device_kind="NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(jax, "devices",
                        lambda backend=None: [gpu] if backend == "gpu" else real_devices(backend))
    monkeypatch.setattr(_ffi, "cuda_module", lambda: types.SimpleNamespace())
    fake_gpu(capability)
    lines = cli._cuda_section()
    assert f"  GPUs          : 1 x NVIDIA A100-SXM4-80GB (compute capability {capability})" in lines
    assert line in lines
