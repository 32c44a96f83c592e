"""The FFI attribute contract of the layer targets (docs/ffi-contract.md), on the CPU backend.

Every backend binds ``pregather_x`` and ``gemm`` (int32) on ``mok_moe_fwd`` / ``mok_moe_bwd``; the
CPU kernels validate them and run one kernel whatever their value. These tests call the targets
directly through ``jax.ffi.ffi_call``, as ``jax_mok`` does, and check the results against the
pure-JAX oracle; a missing, extra or out-of-range attribute must fail with an error that names it.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mok import reference, testing
from jax_mok.kernels import _ffi

pytestmark = pytest.mark.skipif(not _ffi.kernels_built("cpu"), reason="CPU kernels not built")


@pytest.fixture(autouse=True)
def _on_cpu():
    """The CPU handlers, also where a GPU is the default device (tests/test_ffi_attributes_cuda.py
    holds the CUDA side)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield

SHAPE = testing.Shape("attrs", model="test", tokens=24, hidden=32, ffn=16, experts=6, top_k=2)
ATTRS = [dict(pregather_x=p, gemm=g) for p in (0, 1) for g in (0, 1)]


def _inputs(dtype, seed: int):
    x, ids, w, wgu, wd = testing.random_inputs(jax.random.key(seed), SHAPE, dtype)
    ids = ids.at[3, 1].set(-1)  # a skipped assignment (capacity drop): contributes 0
    return x, ids, w, wgu, wd


def _attrs(**values):
    return {name: np.int32(value) for name, value in values.items()}


def _forward(x, ids, w, wgu, wd, **attrs):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.ffi.ffi_call("mok_moe_fwd", out)(x, ids, w, wgu, wd, **_attrs(**attrs))


def _backward(dy, x, ids, w, wgu, wd, **attrs):
    outs = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(w.shape, jnp.float32),
            jax.ShapeDtypeStruct(wgu.shape, wgu.dtype), jax.ShapeDtypeStruct(wd.shape, wd.dtype))
    return jax.ffi.ffi_call("mok_moe_bwd", outs)(dy, x, ids, w, wgu, wd, **_attrs(**attrs))


# The oracle, jitted once: every case's upcast operands have the same shapes (one compile, not
# an op-by-op dispatch).
_reference = jax.jit(reference.routed_experts)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("attrs", ATTRS, ids=["pregather0-auto", "pregather0-simt",
                                               "pregather1-auto", "pregather1-simt"])
def test_forward_with_attributes_matches_reference(dtype, attrs):
    x, ids, w, wgu, wd = _inputs(dtype, seed=11)
    got = _forward(x, ids, w, wgu, wd, **attrs)
    want = _reference(*testing.upcast((x, ids, w, wgu, wd)))
    # testing.TOLERANCE: 1e-4 for float32 (summation order), 1e-2 for bfloat16 (the operands'
    # and the activation's rounding against a float32 oracle).
    assert testing.rel_error(got, want) < testing.tolerance(dtype)


def test_attributes_do_not_change_the_cpu_result():
    x, ids, w, wgu, wd = _inputs(jnp.bfloat16, seed=12)
    results = [np.asarray(_forward(x, ids, w, wgu, wd, **a).astype(jnp.float32)) for a in ATTRS]
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])  # one CPU kernel: bitwise


def test_backward_with_attributes_matches_reference():
    x, ids, w, wgu, wd = _inputs(jnp.float32, seed=13)
    dy = jax.random.normal(jax.random.key(14), x.shape, jnp.float32)
    got = _backward(dy, x, ids, w, wgu, wd, pregather_x=1, gemm=0)
    # The oracle's vjp jitted: one compile instead of its op-by-op dispatch.
    dx, d_w, d_wgu, d_wd = jax.jit(lambda *a: jax.vjp(
        lambda a, b, c, d: reference.routed_experts(a, ids, b, c, d), *a)[1](dy))(x, w, wgu, wd)
    valid = (ids >= 0) & (ids < SHAPE.experts)
    for name, g, r in [("dx", got[0], dx), ("d_topk_weights", got[1], jnp.where(valid, d_w, 0.0)),
                       ("d_w_gate_up", got[2], d_wgu), ("d_w_down", got[3], d_wd)]:
        assert testing.rel_error(g, r) < testing.tolerance(jnp.float32), name


# XLA decodes the bound attributes itself and rejects a call whose attributes differ from the
# binding before the handler runs; its messages name the attributes involved.
@pytest.mark.parametrize("missing,given", [("pregather_x", "gemm"), ("gemm", "pregather_x")])
def test_missing_attribute_fails(missing, given):
    x, ids, w, wgu, wd = _inputs(jnp.float32, seed=15)
    attrs = {"pregather_x": 0, "gemm": 0}
    del attrs[missing]
    with pytest.raises(Exception, match=f"expected 2 but got 1 with name.*: {given}"):
        jax.block_until_ready(_forward(x, ids, w, wgu, wd, **attrs))


def test_call_without_any_attribute_fails():
    x, ids, w, wgu, wd = _inputs(jnp.float32, seed=16)
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    with pytest.raises(Exception, match="expected 2 but got 0"):
        jax.block_until_ready(jax.ffi.ffi_call("mok_moe_fwd", out)(x, ids, w, wgu, wd))


def test_misspelled_attribute_fails_naming_both():
    x, ids, w, wgu, wd = _inputs(jnp.float32, seed=17)
    with pytest.raises(Exception, match="gem vs gemm"):
        jax.block_until_ready(_forward(x, ids, w, wgu, wd, pregather_x=0, gem=0))


def test_extra_attribute_fails():
    x, ids, w, wgu, wd = _inputs(jnp.float32, seed=17)
    with pytest.raises(Exception, match="expected 2 but got 3 with name.*stages"):
        jax.block_until_ready(_forward(x, ids, w, wgu, wd, pregather_x=0, gemm=0, stages=4))


def test_attribute_of_the_wrong_type_fails():
    x, ids, w, wgu, wd = _inputs(jnp.float32, seed=17)
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    call = jax.ffi.ffi_call("mok_moe_fwd", out)
    # 0.5, not 0.0: jax's compilation cache treats a float attribute equal to an earlier int one
    # (0.0 == 0) as the same call.
    with pytest.raises(Exception, match="expected S32 but got F32"):
        jax.block_until_ready(call(x, ids, w, wgu, wd, pregather_x=np.float32(0.5),
                                   gemm=np.int32(0)))


@pytest.mark.parametrize("name,value", [("gemm", 2), ("gemm", -1), ("pregather_x", 3)])
def test_out_of_range_attribute_fails_naming_it(name, value):
    x, ids, w, wgu, wd = _inputs(jnp.float32, seed=18)
    attrs = {"pregather_x": 0, "gemm": 0, name: value}
    with pytest.raises(Exception, match=f"attribute {name} must be .*got {value}"):
        jax.block_until_ready(_forward(x, ids, w, wgu, wd, **attrs))
    dy = jnp.ones_like(x)
    with pytest.raises(Exception, match=f"attribute {name} must be .*got {value}"):
        jax.block_until_ready(_backward(dy, x, ids, w, wgu, wd, **attrs))


_BAD_ENV_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from jax_mok.kernels import _ffi
assert _ffi.kernels_built("cpu")
try:
    _ffi.cpu_module().num_threads()
except ValueError as e:
    print("num_threads:", e)
x = jnp.ones((4, 8)); ids = jnp.zeros((4, 1), jnp.int32); w = jnp.ones((4, 1))
wgu = jnp.ones((2, 8, 16)); wd = jnp.ones((2, 8, 8))
try:
    jax.block_until_ready(jax.ffi.ffi_call("mok_moe_fwd", jax.ShapeDtypeStruct((4, 8), x.dtype))(
        x, ids, w, wgu, wd, pregather_x=np.int32(0), gemm=np.int32(0)))
    print("call: ok")
except Exception as e:
    print("call:", e)
"""


@pytest.mark.parametrize("variable,value", [("JAX_MOK_CPU_THREADS", "four"),
                                            ("JAX_MOK_CPU_THREADS", "0"),
                                            ("JAX_MOK_CUDA_DEBUG_SYNC", "yes")])
def test_bad_debug_variable_is_reported(variable, value):
    """The env registry (ffi/common/env.h) is read once per process: a fresh one per value."""
    env = {**os.environ, variable: value, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", _BAD_ENV_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"num_threads: jax_mok: environment variable {variable}={value}" in out.stdout
    assert "call: " in out.stdout and f"{variable}={value}" in out.stdout.split("call: ")[1]


def test_workspace_constants():
    """The layout constants the Python workspace sizing mirrors (docs/ffi-contract.md); the CUDA
    module imports without a driver (static cudart), so this runs wherever it is built."""
    try:
        module = importlib.import_module("jax_mok._mok_cuda")
    except ImportError:
        pytest.skip("jax_mok._mok_cuda is not built")
    constants = module.workspace_constants()
    assert constants == {"signal_bytes": 4096, "max_ranks": 64, "areas": 4, "field_align": 16}
