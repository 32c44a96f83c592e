"""The FFI attribute contract on the CUDA backend (docs/ffi-contract.md): the layer targets called
directly through ``jax.ffi.ffi_call`` with ``pregather_x`` and ``gemm``, against the float32
oracle, and the bitwise identities the attributes must keep (pregathered x == gathered rows; the
saved-activation pair == the recomputing backward).

Skipped without a GPU; ``JAX_MOK_REQUIRE_CUDA=1`` turns the skips into failures (GPU machine).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mok import reference, testing
from jax_mok.kernels import _ffi

pytestmark = pytest.mark.gpu

# H and F multiples of 8 (16-byte rows); F < 256 and H < 256 leave partial wgmma n-tiles, T*k/E
# rows per expert leave partial m-tiles, so both tile edges are exercised.
SHAPE = testing.Shape("attrs-cuda", model="test", tokens=300, hidden=192, ffn=136, experts=6,
                      top_k=2)


@pytest.fixture(scope="module", autouse=True)
def _cuda_backend():
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    reason = None if gpus else "no CUDA GPU visible to JAX"
    if reason is None and not _ffi.kernels_built("cuda"):
        reason = "jax_mok._mok_cuda is not built"
    if reason is not None:
        if os.environ.get("JAX_MOK_REQUIRE_CUDA", "") == "1":
            pytest.fail(f"JAX_MOK_REQUIRE_CUDA=1 but {reason}")
        pytest.skip(reason)
    with jax.default_device(gpus[0]):
        yield


def _inputs(dtype, seed: int):
    x, ids, w, wgu, wd = testing.random_inputs(jax.random.key(seed), SHAPE, dtype)
    ids = ids.at[5, 1].set(-1)  # a skipped assignment
    return x, ids, w, wgu, wd


def _i32(**values):
    return {k: np.int32(v) for k, v in values.items()}


def _fwd(x, ids, w, wgu, wd, *, train=False, **attrs):
    y = jax.ShapeDtypeStruct(x.shape, x.dtype)
    if not train:
        return jax.ffi.ffi_call("mok_moe_fwd", y)(x, ids, w, wgu, wd, **_i32(**attrs))
    h = jax.ShapeDtypeStruct((ids.size, wgu.shape[2]), x.dtype)
    return jax.ffi.ffi_call("mok_moe_fwd_train", (y, h))(x, ids, w, wgu, wd, **_i32(**attrs))


def _bwd(dy, x, ids, w, wgu, wd, h=None, **attrs):
    outs = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(w.shape, jnp.float32),
            jax.ShapeDtypeStruct(wgu.shape, wgu.dtype), jax.ShapeDtypeStruct(wd.shape, wd.dtype))
    if h is None:
        return jax.ffi.ffi_call("mok_moe_bwd", outs)(dy, x, ids, w, wgu, wd, **_i32(**attrs))
    return jax.ffi.ffi_call("mok_moe_bwd_saved", outs)(dy, x, ids, w, wgu, wd, h, **_i32(**attrs))


def _reference_grads(dy, x, ids, w, wgu, wd):
    f32 = testing.upcast((dy, x, w, wgu, wd))
    _, vjp = jax.vjp(lambda a, b, c, d: reference.routed_experts(a, ids, b, c, d), *f32[1:])
    dx, d_w, d_wgu, d_wd = vjp(f32[0])
    valid = (ids >= 0) & (ids < SHAPE.experts)
    return dx, jnp.where(valid, d_w, 0.0), d_wgu, d_wd


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("gemm", [0, 1], ids=["auto", "simt"])
@pytest.mark.parametrize("pregather_x", [0, 1])
def test_forward_and_backward_match_reference(dtype, gemm, pregather_x):
    x, ids, w, wgu, wd = _inputs(dtype, seed=21)
    dy = jax.random.normal(jax.random.key(22), x.shape, jnp.float32).astype(dtype)
    attrs = dict(pregather_x=pregather_x, gemm=gemm)
    # The reference at full float32 matmul precision: XLA's GPU default for float32 dots is TF32
    # (5e-4 off, seen on an H200), which the kernels are not.
    with jax.default_matmul_precision("highest"):
        want = reference.routed_experts(*testing.upcast((x, ids, w, wgu, wd)))
        want_grads = _reference_grads(dy, x, ids, w, wgu, wd)
    # testing.TOLERANCE: 1e-4 float32 (summation order), 1e-2 bfloat16 (operand rounding).
    assert testing.rel_error(_fwd(x, ids, w, wgu, wd, **attrs), want) < testing.tolerance(dtype)
    got = _bwd(dy, x, ids, w, wgu, wd, **attrs)
    for name, g, r in zip(("dx", "d_topk_weights", "d_w_gate_up", "d_w_down"), got, want_grads,
                          strict=True):
        tol = testing.tolerance(dtype, router_grad=name == "d_topk_weights")
        assert testing.rel_error(g, r) < tol, name


def test_pregather_does_not_change_a_bit():
    """x copied into expert order and loaded by TMA == the rows gathered by cp.async (wgmma)."""
    x, ids, w, wgu, wd = _inputs(jnp.bfloat16, seed=23)
    a = _fwd(x, ids, w, wgu, wd, pregather_x=0, gemm=0)
    b = _fwd(x, ids, w, wgu, wd, pregather_x=1, gemm=0)
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.mark.parametrize("pregather_x", [0, 1])
def test_saved_pair_equals_recompute_bitwise(pregather_x):
    x, ids, w, wgu, wd = _inputs(jnp.bfloat16, seed=24)
    dy = jax.random.normal(jax.random.key(25), x.shape, jnp.bfloat16)
    attrs = dict(pregather_x=pregather_x, gemm=0)
    y, h = _fwd(x, ids, w, wgu, wd, train=True, **attrs)
    np.testing.assert_array_equal(np.asarray(y, np.float32),
                                  np.asarray(_fwd(x, ids, w, wgu, wd, **attrs), np.float32))
    saved = _bwd(dy, x, ids, w, wgu, wd, h, **attrs)
    recomputed = _bwd(dy, x, ids, w, wgu, wd, **attrs)
    for a, b in zip(saved, recomputed, strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.mark.parametrize("name,value", [("gemm", 2), ("pregather_x", -1)])
def test_out_of_range_attribute_fails_naming_it(name, value):
    x, ids, w, wgu, wd = _inputs(jnp.bfloat16, seed=26)
    attrs = {"pregather_x": 0, "gemm": 0, name: value}
    with pytest.raises(Exception, match=f"attribute {name} must be .*got {value}"):
        jax.block_until_ready(_fwd(x, ids, w, wgu, wd, **attrs))
