"""GPU tests of mxfp8 through the BF16 GEMMs (``jax_mok.quantization.cuda
.routed_experts_mx_bf16_cuda``, mxfp8's path for bf16 x with unquantized weight gradients): values
and every gradient against the pure-JAX mxfp8 layer, prepared weights bitwise equal to the plain
call, bitwise determinism, the qdq kernel's bits. Skipped without a GPU; ``JAX_MOK_REQUIRE_CUDA=1``
turns the skips into failures (GPU machine).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from test_cuda_fp8 import (  # noqa: E402, F401 - _cuda_backend: the same autouse fixture
    CASES,
    NAMES,
    _cuda_backend,
    _poison,
    _reference,
    _rel,
    _vjp_fn,
)
from test_cuda_kernels import _problem  # noqa: E402

pytestmark = pytest.mark.gpu


def _mx(prepared=None, weight_grads="unquantized"):
    """The mxfp8 layer on the kernels: through the BF16 GEMMs with unquantized weight gradients,
    on the promoted FP8 kernels with ``weight_grads="fp8"``."""
    from jax_mok.quantization import cuda as kernels_fp8

    return _vjp_fn(lambda x, ids, w, wgu, wd: kernels_fp8.routed_experts_fp8(
        x, ids, w, wgu, wd, "mxfp8", implementation="cuda", weight_grads=weight_grads,
        prepared=prepared))


def _bits(a):
    return np.asarray(a).view(np.uint8)


@pytest.mark.parametrize("T,H,F,E,k,kind", CASES)
def test_matches_mx_reference(T, H, F, E, k, kind):
    """The oracle sums in float32 at full precision on the dequantized operands; the BF16 wgmma
    multiplies them exactly (at most 4 significant bits each) and accumulates in float32, so what
    differs is the summation order and the bf16 rounding of the outputs the layer rounds (h, dh,
    y, the gradients), through which a value of a or dh now and then lands on the neighbouring E4M3
    step. Bound 1e-2, the FP8 kernels' float32 bound (test_cuda_fp8.py), which also covers their
    reduced-precision accumulation that this path does not have."""
    args = _problem(T + E + 2, T, H, F, E, k, jnp.bfloat16, kind)
    ref = _reference("mxfp8", args, "unquantized")
    _poison(*ref)
    got = _mx()(*args)
    for name, g, r in zip(NAMES, got, ref, strict=True):
        assert g.shape == r.shape and g.dtype == r.dtype, f"{name}: {g.shape} {g.dtype}"
        err = _rel(g, r)
        assert err <= 1e-2, f"{name}: rel error {err:.3e} ({T=} {H=} {F=} {kind})"
    dw = np.asarray(got[2])
    assert np.all(dw[np.asarray(args[1]) < 0] == 0.0), "skipped assignments: zero d_topk_weights"


def test_deterministic_and_prepared_equals_plain():
    from jax_mok.quantization.weights import mx_bf16_weights

    args = _problem(7, *CASES[4][:5], jnp.bfloat16, CASES[4][5])
    first = _mx()(*args)
    again = _mx()(*args)
    prepared = mx_bf16_weights(args[3], args[4])
    assert prepared.form == "bf16"
    with_prepared = _mx(prepared)(*args)
    for name, a, b, c in zip(NAMES, first, again, with_prepared, strict=True):
        assert np.array_equal(_bits(a), _bits(b)), f"{name}: not deterministic"
        assert np.array_equal(_bits(a), _bits(c)), f"{name}: prepared differs from plain"


@pytest.mark.parametrize("axis,shape", [(1, (300, 256)), (1, (3, 64, 96)), (2, (3, 64, 96))])
def test_qdq_kernel_bits_equal_jax(axis, shape):
    """mok_mx_qdq: deq(Q(x)) in bf16, bit for bit jax_mok.quantization's (values times their
    block's 2^e, float32, then to bf16), with special values in some blocks."""
    from jax_mok.kernels import targets
    from jax_mok.quantization import blocks

    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(np.float32) * 3.0
    flat = x.reshape(-1, shape[-1])
    flat[0, :32] = 0.0
    flat[1, :32] *= 1e30
    flat[2, :32] *= 1e-30
    flat[3, 5] = np.nan
    flat[4, 7] = np.inf
    x = jnp.asarray(flat.reshape(shape), jnp.bfloat16)
    got = jax.jit(lambda x: targets.mx_qdq(x, axis))(x)
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        want = blocks.fake_quantize(jax.device_put(x, cpu), "mxfp8", axis).astype(jnp.bfloat16)
    g, w = np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16)
    nan = np.isnan(np.asarray(want, np.float32))
    assert np.array_equal(np.isnan(np.asarray(got, np.float32)), nan)
    bad = np.flatnonzero((g != w) & ~nan)
    assert bad.size == 0, f"{bad.size} elements differ, first at {bad[:3].tolist()}"


def test_close_to_the_promoted_fp8_kernels():
    """The data path of both computes the same semantics (y, dx, d_topk_weights; the weight
    gradients differ by definition: FP8 there, bf16 here); the promoted FP8 wgmma's
    reduced-precision accumulation is the larger part of their distance (within the sum of the
    reference tests' bounds)."""
    args = _problem(11, *CASES[0][:5], jnp.bfloat16, CASES[0][5])
    bf16 = _mx()(*args)
    fp8 = _mx(weight_grads="fp8")(*args)
    for name, a, b in list(zip(NAMES, bf16, fp8, strict=True))[:3]:
        assert _rel(a, b) <= 2.5e-2, name
