"""GPU tests of the expert-weight quantizer (``mok_quantize_weight``, ffi/cuda/device/
fp8_quantize.cuh): its bits against :meth:`jax_mok.quantization.QuantizedWeight.quantize` computed
by XLA:CPU (the specification), for both recipes, both input dtypes and both layouts, on weights
whose 128 x 128 tiles hold the edge cases (zeros, huge, tiny / subnormal, NaN, infinity, powers
of two, ties). Outputs are poisoned first, so an unwritten byte shows.

Skipped without a GPU; ``JAX_MOK_REQUIRE_CUDA=1`` turns the skips into failures.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytestmark = pytest.mark.gpu

RECIPES = ("mxfp8", "fp8_block")


# The FP8 kernel tests' check for the CUDA build (an autouse fixture: skips, or fails with
# JAX_MOK_REQUIRE_CUDA=1, where jax_mok._mok_cuda is not built).
from test_cuda_fp8 import _cuda_backend  # noqa: E402, F401


def _weights(rng, shape, dtype):
    """Random weights with edge cases placed in whole tiles and in single blocks of 32."""
    w = rng.standard_normal(shape).astype(np.float32) * 0.02
    w[0, :128, :128] = 0.0                                  # an all-zero tile
    w[0, 128:160, :32] *= 1e30                              # huge block
    w[0, :32, 128:160] *= 1e-39 if dtype == jnp.float32 else 1e-30  # tiny / subnormal
    w[-1, 5, 7] = np.nan
    w[-1, 200, 70] = np.inf
    w[-1, 130:138, 130:138] = -np.inf
    w[1 % shape[0], :128, :128] = 2.0 ** rng.integers(-20, 20, (128, 128))
    w[1 % shape[0], 128:256, :128] = 448.0 * (1 + np.arange(128) / 128)
    return jnp.asarray(w, dtype)


def _poison():
    junk = jnp.full((64 << 20,), jnp.nan, jnp.float32)  # 256 MB, freed again: XLA reuses it
    jax.block_until_ready(junk)
    del junk


def _expected(w, recipe, axis):
    from jax_mok.quantization import QuantizedWeight

    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        q = QuantizedWeight.quantize(jax.device_put(w, cpu), recipe, axis)
        return np.asarray(q.values), np.asarray(q.scales)


def _same_bits(name, got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{name}: got {got.shape} {got.dtype}, want {want.shape} {want.dtype}")
    gb, wb = got.view(np.uint8), want.view(np.uint8)
    bad = np.argwhere(gb != wb)
    assert bad.size == 0, f"{name}: {len(bad)} bytes differ, first at {bad[:3].tolist()}"


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("axis", [1, 2])
def test_quantize_weight_bits_equal_jax(recipe, dtype, axis):
    from jax_mok.kernels import targets

    w = _weights(np.random.default_rng(7 + axis), (3, 256, 384), dtype)
    _poison()
    values, scales = jax.jit(lambda w: targets.quantize_weight(w, recipe, axis))(w)
    want_v, want_s = _expected(w, recipe, axis)
    _same_bits("values", values, want_v)
    _same_bits("scales", scales, want_s)


@pytest.mark.parametrize("recipe", RECIPES)
def test_quantize_weight_both_equals_each_layout(recipe):
    """One pass writing both layouts gives each single layout's bits (fresh weights, other
    dims: an expert count and tile grid unlike the test above)."""
    from jax_mok.kernels import targets

    w = _weights(np.random.default_rng(11), (5, 384, 128), jnp.bfloat16)
    _poison()
    (a_v, a_s), (b_v, b_s) = jax.jit(lambda w: targets.quantize_weight_both(w, recipe))(w)
    for axis, (v, s) in ((1, (a_v, a_s)), (2, (b_v, b_s))):
        want_v, want_s = _expected(w, recipe, axis)
        _same_bits(f"values along axis {axis}", v, want_v)
        _same_bits(f"scales along axis {axis}", s, want_s)


@pytest.mark.parametrize("recipe", RECIPES)
def test_quantize_params_on_the_gpu_equals_the_reference(recipe):
    """jax_mok.quantize_params quantizes with the CUDA kernel on a GPU (no whole-weight
    transpose in XLA, which at S4 did not fit); its result is the JAX quantizer's, bit for bit."""
    import jax_mok
    from jax_mok import testing

    config = jax_mok.MoEConfig(num_experts=3, top_k=2, hidden_size=256, ffn_size=384)
    params = testing.random_params(jax.random.key(3), config, jnp.float32)
    params = dataclasses.replace(
        params, w_gate_up=_weights(np.random.default_rng(5), (3, 256, 768), jnp.float32))
    _poison()
    got = jax_mok.quantize_params(params, recipe, dtype=jnp.bfloat16)
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        want = jax_mok.quantize_params(jax.device_put(params, cpu), recipe, dtype=jnp.bfloat16,
                                       implementation="reference")
    for name in ("w_gate_up", "w_down"):
        g, w = getattr(got, name), getattr(want, name)
        _same_bits(f"{name} values", g.values, w.values)
        _same_bits(f"{name} scales", g.scales, w.scales)


def test_quantize_weight_rejects_ragged_dims():
    from jax_mok.kernels import targets

    w = jnp.ones((2, 192, 128), jnp.bfloat16)
    with pytest.raises(Exception, match="multiples of 128"):
        jax.block_until_ready(targets.quantize_weight(w, "fp8_block", 1))
