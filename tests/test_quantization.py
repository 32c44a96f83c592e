"""jax_mok.quantization against a NumPy oracle, bit for bit, for both recipes.

The oracle is written from the format's definition with NumPy's IEEE arithmetic (no subnormal
flushing) and ml_dtypes for E4M3 / E8M0; the JAX functions must reproduce it on every input
family: random, tiny, huge, subnormal, all-zero blocks, partial blocks, rounding ties, ±inf/NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mok
from jax_mok import quantization as qz

E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu


# --- the oracle -------------------------------------------------------------------------------

def _blocks(x32: np.ndarray, block: int) -> np.ndarray:
    pad = -x32.shape[-1] % block
    x32 = np.pad(x32, [(0, 0)] * (x32.ndim - 1) + [(0, pad)])
    return x32.reshape(*x32.shape[:-1], -1, block)


def _e4m3(scaled: np.ndarray, nonfinite: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        values = np.clip(scaled, -448, 448).astype(E4M3)
    values[np.broadcast_to(nonfinite, values.shape)] = np.float32("nan")
    return values


def np_quantize_mxfp8(x, axis=-1):
    x32 = np.moveaxis(np.asarray(x).astype(np.float32), axis, -1)
    n = x32.shape[-1]
    blocks = _blocks(x32, 32)
    amax = np.max(np.abs(blocks), axis=-1)  # NaN propagates
    nonfinite = ~np.isfinite(amax)
    m, q = np.frexp(np.where(nonfinite, 1, amax))
    e = np.clip(np.where(m <= 0.875, q - 9, q - 8), -127, 127)
    e = np.where(amax == 0, -127, e).astype(np.int32)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = np.ldexp(blocks, -e[..., None]).astype(np.float32)  # exact (or below 2**-126)
    values = _e4m3(scaled, nonfinite[..., None]).reshape(*x32.shape[:-1], -1)[..., :n]
    scales = np.where(nonfinite, 255, e + 127).astype(np.uint8).view(E8M0)
    return np.moveaxis(values, -1, axis), np.moveaxis(scales, -1, axis)


def np_dequantize_mxfp8(values, scales, axis=-1):
    values = np.moveaxis(np.asarray(values), axis, -1)
    e = np.moveaxis(np.asarray(scales).view(np.uint8).astype(np.int64) - 127, axis, -1)
    e = np.repeat(e, 32, axis=-1)[..., :values.shape[-1]]
    with np.errstate(invalid="ignore", over="ignore"):
        out = (values.astype(np.float64) * np.exp2(e.astype(np.float64))).astype(np.float32)
    out[e == 128] = np.nan
    return np.moveaxis(out, -1, axis)


def _np_block_scale(amax: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        quotient = (amax / np.float32(448)).astype(np.float32)
    scale = np.where(quotient >= np.float32(2.0**-117), quotient, np.float32(1))
    return np.where(np.isfinite(amax), scale, np.float32("nan")).astype(np.float32)


def np_quantize_fp8_block(x, block=(1, 128)):
    x32 = np.asarray(x).astype(np.float32)
    if block == (1, 128):
        n = x32.shape[-1]
        blocks = _blocks(x32, 128)
        scale = _np_block_scale(np.max(np.abs(blocks), axis=-1))
        with np.errstate(invalid="ignore", over="ignore"):
            scaled = (blocks / scale[..., None]).astype(np.float32)
        values = _e4m3(scaled, np.isnan(scale)[..., None])
        return values.reshape(*x32.shape[:-1], -1)[..., :n], scale
    r, c = x32.shape[-2:]
    pads = [(0, 0)] * (x32.ndim - 2) + [(0, -r % 128), (0, -c % 128)]
    padded = np.pad(x32, pads)
    tiles = padded.reshape(*padded.shape[:-2], padded.shape[-2] // 128, 128, -1, 128)
    scale = _np_block_scale(np.max(np.abs(tiles), axis=(-3, -1)))
    s = scale[..., :, None, :, None]
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = (tiles / s).astype(np.float32)
    values = _e4m3(scaled, np.isnan(s)).reshape(padded.shape)[..., :r, :c]
    return values, scale


def np_dequantize_fp8_block(values, scales, block=(1, 128)):
    v = np.asarray(values).astype(np.float32)
    if block == (1, 128):
        s = np.repeat(np.asarray(scales), 128, axis=-1)[..., :v.shape[-1]]
    else:
        s = np.repeat(np.repeat(np.asarray(scales), 128, axis=-2), 128, axis=-1)
        s = s[..., :v.shape[-2], :v.shape[-1]]
    with np.errstate(invalid="ignore", over="ignore"):
        return (v * s).astype(np.float32)


# --- inputs -----------------------------------------------------------------------------------

def _f32(bits) -> np.ndarray:
    return np.asarray(bits, np.uint32).view(np.float32)


def _e4m3_grid() -> np.ndarray:
    """Every finite E4M3 value, the midpoints between neighbours and the floats next to them:
    the rounding boundaries."""
    grid = np.sort(np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32))
    grid = grid[np.isfinite(grid)]
    mids = ((grid[1:].astype(np.float64) + grid[:-1]) / 2).astype(np.float32)
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(-np.inf))])
    return np.concatenate([grid, mids, near])


def _families(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Named float32 inputs of shape [rows, cols] (cols not a multiple of 32 or 128)."""
    rows, cols = 6, 300
    magnitude = np.exp2(rng.integers(-40, 40, size=(rows, 1))).astype(np.float32)
    families = {
        "random": (rng.standard_normal((rows, cols)) * magnitude).astype(np.float32),
        "tiny": (rng.standard_normal((rows, cols)) * np.float32(1e-36)).astype(np.float32),
        "subnormal": _f32(rng.integers(0, 0x00800000, size=(rows, cols)))
        * rng.choice([-1, 1], size=(rows, cols)).astype(np.float32),
        "huge": (rng.uniform(-1, 1, (rows, cols)) * np.float32(3.4e38)).astype(np.float32),
        "bits": _f32(rng.integers(0, 0x7F800000, size=(rows, cols)))
        * rng.choice([-1, 1], size=(rows, cols)).astype(np.float32),
    }
    # Blocks near the scale boundaries: amax exactly 448 * 2**k and one ulp either side (m = 0.875
    # in mxfp8), and normal / subnormal mixtures where scaling brings subnormals into E4M3 range.
    edge = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
    edge[0, 0] = 448.0
    edge[1, 40] = np.nextafter(np.float32(448 * 2.0**-20), np.float32(np.inf))
    edge[2, 70] = np.nextafter(np.float32(448 * 2.0**30), np.float32(0))
    edge[3, :] = _f32(rng.integers(1, 0x00800000, size=cols))
    edge[3, 5] = np.float32(2.0**-120)  # amax normal, the rest of the row subnormal
    edge[4, :] = 0.0
    edge[4, 200] = -0.0
    edge[5, :128] = np.float32(448 * 2.0**-117) * rng.uniform(0.9, 1.1, 128).astype(np.float32)
    families["edge"] = edge
    grid = _e4m3_grid()
    scale = np.exp2(rng.integers(-30, 30, size=(rows, 1))).astype(np.float32)
    ties = rng.choice(grid, size=(rows, cols)).astype(np.float32) * scale
    ties[:, ::32] = 448.0 * scale  # pin amax so the values sit on the grid after scaling
    ties[:, ::128] = 448.0 * scale
    families["ties"] = ties
    special = (rng.standard_normal((rows, cols))).astype(np.float32)
    special[0, 3] = np.nan
    special[1, 100] = np.inf
    special[2, 299] = -np.inf
    special[3, 33] = np.float32(-np.nan)
    families["special"] = special
    return families


FAMILIES = list(_families(np.random.default_rng(0)))


def _assert_bits(got, want, what: str):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    width = {1: np.uint8, 4: np.uint32}[got.dtype.itemsize]
    g, w = got.view(width), want.view(width)
    if got.dtype == np.float32:  # NaN payloads are not part of the format: compare NaN-ness
        nan = np.isnan(got)
        np.testing.assert_array_equal(nan, np.isnan(want), err_msg=f"{what}: NaN positions")
        g, w = np.where(nan, 0, g), np.where(nan, 0, w)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{what}: {bad.size} of {g.size} differ, first at flat index {bad[0]}: "
                           f"got {g.flat[bad[0]]:#x}, want {w.flat[bad[0]]:#x}")


# --- bit-exactness ----------------------------------------------------------------------------

def _stacked(seed: int, dtype) -> np.ndarray:
    """Every family stacked: ``[families, rows, cols]`` (one compile covers them all)."""
    with np.errstate(over="ignore"):  # "huge" float32 values are infinities in float16
        return np.stack(list(_families(np.random.default_rng(seed)).values())).astype(dtype)


def _per_family(got, want, what: str, axis: int = 0):
    for i, family in enumerate(FAMILIES):
        _assert_bits(np.take(np.asarray(got), i, axis), np.take(np.asarray(want), i, axis),
                     f"{what} ({family})")


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_mxfp8_matches_oracle(dtype):
    x = _stacked(1, dtype)
    for axis in (-1, 1):  # along the columns, and along the rows (6: one partial block)
        values, scales = jax.jit(qz.quantize_mxfp8, static_argnums=1)(jnp.asarray(x), axis)
        want_values, want_scales = np_quantize_mxfp8(x, axis)
        _per_family(values, want_values, f"values, axis {axis}")
        _per_family(scales, want_scales, f"scales, axis {axis}")
        back = jax.jit(qz.dequantize_mxfp8, static_argnums=2)(values, scales, axis)
        _per_family(back, np_dequantize_mxfp8(want_values, want_scales, axis),
                    f"dequantized, axis {axis}")


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_fp8_block_matches_oracle(dtype):
    x = _stacked(2, dtype)
    for block, shaped in (((1, 128), x), ((128, 128), np.tile(x, (1, 30, 1)))):
        values, scales = jax.jit(qz.quantize_fp8_block, static_argnums=1)(jnp.asarray(shaped),
                                                                           block)
        want_values, want_scales = np_quantize_fp8_block(shaped, block)
        _per_family(values, want_values, f"values, {block}")
        _per_family(scales, want_scales, f"scales, {block}")
        back = jax.jit(qz.dequantize_fp8_block, static_argnums=2)(values, scales, block)
        _per_family(back, np_dequantize_fp8_block(want_values, want_scales, block),
                    f"dequantized, {block}")


def test_shapes_partial_blocks_and_axes():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 33, 5)).astype(np.float32)
    values, scales = qz.quantize_mxfp8(jnp.asarray(x), axis=1)
    assert values.shape == x.shape and values.dtype == jnp.float8_e4m3fn
    assert scales.shape == (3, 2, 5) and scales.dtype == jnp.float8_e8m0fnu
    _assert_bits(values, np_quantize_mxfp8(x, 1)[0], "values along axis 1")
    for n, blocks in ((1, 1), (127, 1), (129, 2)):
        v, s = qz.quantize_fp8_block(jnp.ones((2, n)))
        assert v.shape == (2, n) and s.shape == (2, blocks) and s.dtype == jnp.float32
    v, s = qz.quantize_fp8_block(jnp.ones((4, 129, 1)), (128, 128))
    assert v.shape == (4, 129, 1) and s.shape == (4, 2, 1)


def test_blocks_along_a_middle_axis_in_place():
    """mxfp8 along a middle axis (a weight's H in [E, H, N]) forms its blocks in place: the
    compiled temporaries stay far below the input's size. Moving the axis last first made XLA
    materialize a transposed float32 copy (about half the input here, twice the input on the
    GPU, where S4's weights ran out of memory)."""
    shape = (8, 1024, 768)
    compiled = jax.jit(qz.quantize_mxfp8, static_argnums=1).lower(
        jax.ShapeDtypeStruct(shape, jnp.bfloat16), 1).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
        pytest.skip("this backend reports no memory analysis")
    input_bytes = int(np.prod(shape)) * 2
    assert analysis.temp_size_in_bytes < 0.25 * input_bytes, analysis.temp_size_in_bytes


def test_non_finite_blocks_are_nan_and_others_untouched():
    x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    x[0, 5] = np.inf  # block 0 of row 0
    x[1, 40] = np.nan  # block 1 of row 1
    values, scales = qz.quantize_mxfp8(jnp.asarray(x))
    v = np.asarray(values).view(np.uint8)
    s = np.asarray(scales).view(np.uint8)
    assert (v[0, :32] == 0x7F).all() and (v[1, 32:] == 0x7F).all()
    assert s[0, 0] == 0xFF and s[1, 1] == 0xFF and s[0, 1] != 0xFF and s[1, 0] != 0xFF
    assert np.isfinite(np.asarray(qz.dequantize_mxfp8(values, scales))[0, 32:]).all()
    values, scales = qz.quantize_fp8_block(jnp.asarray(x), (1, 128))
    assert np.isnan(np.asarray(scales)).all()  # one block per row, both non-finite
    assert (np.asarray(values).view(np.uint8) == 0x7F).all()


# --- error bounds -----------------------------------------------------------------------------

@pytest.mark.parametrize("recipe", qz.RECIPES)
def test_round_trip_error_bounds(recipe):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 512)) * np.exp2(rng.integers(-20, 20, (64, 1)))).astype(
        np.float32)
    values, scales = qz.quantize(jnp.asarray(x), recipe)
    back = np.asarray(qz.fake_quantize(jnp.asarray(x), recipe), np.float64)
    if recipe == "mxfp8":
        step = np.repeat(np.exp2(np.asarray(scales).view(np.uint8).astype(np.float64) - 127),
                         32, axis=-1)
        # amax <= 448 * 2**e (nothing saturates) and > 224 * 2**e: the largest |value| of each
        # block rounds into [224, 448].
        top = np.abs(np.asarray(values).astype(np.float32)).reshape(64, -1, 32).max(-1)
        assert (top >= 224).all() and (top <= 448).all()
    else:
        step = np.repeat(np.asarray(scales, np.float64), 128, axis=-1)
    # Round to nearest: half an E4M3 ulp relative (2**-4) for normals, 2**-10 * scale absolute
    # under E4M3's normal range; 2**-20 covers fp8_block's float32 quotient and product.
    bound = (2.0**-4 + 2.0**-20) * np.abs(x) + 2.0**-10 * step * (1 + 2.0**-20)
    assert (np.abs(back - x) <= bound).all()
    # Norm-wise: the half-ulp error spread over the mantissa is ~2.65 % RMS for Gaussian data.
    err = np.linalg.norm(back - x) / np.linalg.norm(x)
    assert 0.015 < err < 0.035, err


# --- QuantizedWeight, quantize_params, errors -------------------------------------------------

@pytest.mark.parametrize("recipe", qz.RECIPES)
def test_quantized_weight_layout(recipe):
    E, H, F = 3, 160, 96
    w = jax.random.normal(jax.random.key(0), (E, H, 2 * F))
    q = qz.QuantizedWeight.quantize(w, recipe, reduction_axis=1)
    assert q.values.shape == (E, 2 * F, H) and q.shape == (E, H, 2 * F)
    want = (E, 2 * F, 5) if recipe == "mxfp8" else (E, 2, 2)
    assert q.scales.shape == want
    if recipe == "mxfp8":
        _assert_bits(q.values, np_quantize_mxfp8(np.swapaxes(np.asarray(w), 1, 2))[0], "values")
    else:
        _assert_bits(q.values, np_quantize_fp8_block(np.swapaxes(np.asarray(w), 1, 2),
                                                     (128, 128))[0], "values")
    back = q.dequantize()
    assert back.shape == w.shape and back.dtype == jnp.float32
    assert 0 < float(jnp.linalg.norm(back - w) / jnp.linalg.norm(w)) < 0.035
    leaves, tree = jax.tree.flatten(q)
    assert len(leaves) == 2 and jax.tree.unflatten(tree, leaves).recipe == recipe
    assert jax.jit(lambda q: q.dequantize())(q).shape == w.shape


def test_quantize_params():
    config = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=64, ffn_size=32)
    params = jax_mok.init_params(jax.random.key(0), config, jnp.float32)
    qp = jax_mok.quantize_params(params, "mxfp8")
    assert qp.config.quantization == "mxfp8" and qp.router is params.router
    assert isinstance(qp.w_gate_up, jax_mok.QuantizedWeight)
    assert qp.w_gate_up.values.shape == (4, 64, 64) and qp.w_down.values.shape == (4, 64, 32)
    assert qp.w_down.shape == (4, 32, 64)
    with pytest.raises(ValueError, match="already a QuantizedWeight"):
        jax_mok.quantize_params(qp, "mxfp8")
    with pytest.raises(ValueError, match="must agree"):
        jax_mok.quantize_params(qp, "fp8_block")
    with pytest.raises(ValueError, match="recipe must be one of"):
        jax_mok.quantize_params(params, "fp4")
    with pytest.raises(TypeError, match="MoEParams"):
        jax_mok.quantize_params({"w": 1}, "mxfp8")


def test_bad_arguments_name_the_problem():
    x = jnp.ones((4, 64))
    with pytest.raises(TypeError, match="floating-point array, got dtype int32"):
        qz.quantize_mxfp8(jnp.ones((4, 64), jnp.int32))
    with pytest.raises(ValueError, match=r"axis must be an int in \[-2, 2\).*got 2"):
        qz.quantize_mxfp8(x, axis=2)
    with pytest.raises(ValueError, match=r"block must be one of .* got \(64, 64\)"):
        qz.quantize_fp8_block(x, (64, 64))
    with pytest.raises(ValueError, match="at least 2 dims"):
        qz.quantize_fp8_block(jnp.ones(300), (128, 128))
    with pytest.raises(ValueError, match="recipe must be one of"):
        qz.quantize(x, "e5m2")
    values, scales = qz.quantize_mxfp8(x)
    with pytest.raises(ValueError, match=r"scales must have shape \(4, 2\).*got \(4, 1\)"):
        qz.dequantize_mxfp8(values, scales[:, :1])
    with pytest.raises(TypeError, match="values must be float8_e4m3fn, got float32"):
        qz.dequantize_mxfp8(x, scales)
    with pytest.raises(TypeError, match="scales must be float32, got float8_e8m0fnu"):
        qz.dequantize_fp8_block(values, scales)


def test_cuda_block_quantizer_bracket_holds():
    """The CUDA fp8_block quantizer (ffi/cuda/device/fp8_format.cuh, quantize_pair) replaces the
    IEEE division x / div by two products x * lo, x * hi with lo, hi = RN(RN(1/div) * (1 -+
    2^-21)), keeping their E4M3 byte where both agree and dividing otherwise. Its exactness rests
    on RN(x / div) lying between the two products; checked here in numpy float32 (IEEE, round to
    nearest) on quotients placed within a few ulp of every E4M3 rounding boundary, and on random
    blocks, where the division must stay rare."""
    e4m3 = ml_dtypes.float8_e4m3fn
    f32 = np.float32

    def byte(q):
        return np.clip(q, -448, 448).astype(e4m3).view(np.uint8)

    def bracket(x, d):
        """The kernel's byte from x * lo, and where x * hi gives the same one."""
        r = (f32(1) / d).astype(f32)
        blo = byte((x * (r * f32(1 - 2.0**-21)).astype(f32)).astype(f32))
        bhi = byte((x * (r * f32(1 + 2.0**-21)).astype(f32)).astype(f32))
        return blo, blo == bhi

    rng = np.random.default_rng(11)
    # boundaries: midpoints between neighbouring E4M3 magnitudes (subnormals included)
    mags = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(e4m3).astype(np.float32)))
    mags = mags[np.isfinite(mags)]
    mids = ((mags[:-1].astype(np.float64) + mags[1:]) / 2).astype(f32)
    exps = rng.integers(-117, 118, 400).astype(f32)
    div = (np.float32(2.0) ** exps * rng.uniform(1, 2, 400).astype(f32)).astype(f32)[:, None, None]
    steps = np.arange(-12, 13, dtype=f32) * f32(2.0**-24)
    q = (mids[None, :, None] * (1 + steps[None, None, :])).astype(f32)
    x = (q * div).astype(f32)
    x = np.concatenate([x, -x], axis=1)
    blo, agree = bracket(x, div)
    bex = byte((x / div).astype(f32))
    assert np.all(bex[agree] == blo[agree]), "the bracket missed RN(x / div)"
    assert 0.2 < agree.mean() < 0.95, agree.mean()  # both outcomes exercised near boundaries
    # random blocks: the products bracket RN(x / div) and agree on nearly every value
    vals = rng.standard_normal((2000, 128)).astype(f32) * f32(2.0) ** rng.integers(
        -60, 60, (2000, 1)).astype(f32)
    d = (np.abs(vals).max(axis=1, keepdims=True) / f32(448)).astype(f32)
    blo, agree = bracket(vals, d)
    bex = byte((vals / d).astype(f32))
    assert np.all(bex[agree] == blo[agree])
    assert agree.mean() > 0.999, agree.mean()
