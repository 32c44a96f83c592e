"""The FP8 layer (jax_mok.quantization.layer, ``MoEConfig.quantization``): phases, whole layer, API.

- Every GEMM operand equals the NumPy oracle's quantization of what the spec says it quantizes
  (bitwise), and every GEMM phase equals a float64 product of those operands.
- The whole layer tracks the unquantized reference layer within E4M3's error (tolerance below),
  is bitwise deterministic, vmaps, runs expert parallel, and refuses what it cannot do.
"""

from __future__ import annotations

import dataclasses
import functools

import cpu_devices
import jax
import jax.numpy as jnp
import numpy as np
import pytest

# The oracle of the format (tests/ is on sys.path under pytest's default import mode).
from test_quantization import (
    np_dequantize_fp8_block,
    np_dequantize_mxfp8,
    np_quantize_fp8_block,
    np_quantize_mxfp8,
)

import jax_mok
import jax_mok.warn
from jax_mok import quantization as qz
from jax_mok import testing
from jax_mok.quantization import cuda as kernels_fp8
from jax_mok.quantization import layer as fp8

CPU_DEVICES = cpu_devices.CPU_DEVICES
cpu_devices.request()

RECIPES = qz.RECIPES
DTYPES = [jnp.float32, jnp.bfloat16]
# A phase against float64 on the same quantized operands: only float32 summation order differs
# (relative ~1e-7 here); 1e-3 is the bound the CUDA kernels are held to (issue 13).
PHASE_TOLERANCE = 1e-3
# The whole layer against the unquantized layer. E4M3 rounds each operand with a relative RMS
# error of ~2.65 % (half an ulp, 2**-4, spread over the mantissa; test_quantization checks it),
# so a GEMM of two quantized operands is off by ~3.75 %, and y, which passes through two such
# GEMMs and the SwiGLU product of two gate/up outputs, by ~6.5 % (measured 6.0-7.5 % for y and
# every gradient on these shapes, both recipes, both dtypes; the router gradient adds the
# cancellation of its softmax Jacobian). Issue 13 asked for 5e-2, which E4M3 operands cannot
# meet; 0.1 is the contract here.
LAYER_TOLERANCE = 0.1

E, K, H, F, T = 6, 2, 200, 72, 96  # H, 2F: partial blocks in both recipes


def _np(a, dtype=np.float32):
    return np.asarray(jnp.asarray(a, jnp.float32)).astype(dtype)


def _oracle_fake_quant(t, recipe, axis=-1):
    """deq(Q(t)) by the NumPy oracle, float32, along ``axis`` (1 x block)."""
    t = np.asarray(t)
    if recipe == "mxfp8":
        return np_dequantize_mxfp8(*np_quantize_mxfp8(t, axis), axis)
    moved = np.moveaxis(t, axis, -1)
    return np.moveaxis(np_dequantize_fp8_block(*np_quantize_fp8_block(moved)), -1, axis)


def _oracle_weight(w, recipe, axis):
    if recipe == "mxfp8":
        return _oracle_fake_quant(w, recipe, axis)
    return np_dequantize_fp8_block(*np_quantize_fp8_block(np.asarray(w), (128, 128)),
                                   (128, 128))


def _inputs(dtype, key=0, drop_every=7):
    keys = jax.random.split(jax.random.key(key), 5)
    x = jax.random.normal(keys[0], (T, H)).astype(dtype)
    ids, weights = testing.random_routing(keys[1], T, E, K)
    ids = ids.at[::drop_every, 1].set(-1)  # capacity drops: skipped rows
    w_gate_up = (jax.random.normal(keys[2], (E, H, 2 * F)) / np.sqrt(H)).astype(dtype)
    w_down = (jax.random.normal(keys[3], (E, F, H)) / np.sqrt(F)).astype(dtype)
    dy = jax.random.normal(keys[4], (T, H)).astype(dtype)
    return x, ids, weights, w_gate_up, w_down, dy


def _grouped64(rows, weights, group_sizes):
    """float64 ``rows[group e] @ weights[e]``; rows past the groups are zero."""
    rows, weights = np.asarray(rows, np.float64), np.asarray(weights, np.float64)
    out = np.zeros((rows.shape[0], weights.shape[-1]))
    start = 0
    for e, n in enumerate(np.asarray(group_sizes)):
        out[start:start + n] = rows[start:start + n] @ weights[e]
        start += n
    return out


def _wgrad64(lhs, rhs, group_sizes):
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out, start = [], 0
    for n in np.asarray(group_sizes):
        out.append(lhs[start:start + n].T @ rhs[start:start + n])
        start += n
    return np.stack(out)


def _close(got, want, what, tol=PHASE_TOLERANCE):
    err = testing.rel_error(got, np.asarray(want, np.float64))
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol}"


def _rounded(a, dtype):
    """float64 ``a`` rounded to ``dtype`` (how a kernel stores an output of that dtype)."""
    return np.asarray(a).astype(jnp.dtype(dtype)).astype(np.float64)


def _token_block_oracle(t, d, recipe):
    """deq(Qt(t)) per expert by the oracle: each expert's rows, blocks along tokens."""
    t = np.asarray(jnp.asarray(t, jnp.float32))
    out = np.zeros_like(t)
    start = 0
    for n in np.asarray(d.group_sizes):
        rows = t[start:start + n]
        if n:
            if recipe == "mxfp8":
                out[start:start + n] = np_dequantize_mxfp8(*np_quantize_mxfp8(rows, 0), 0)
            else:
                out[start:start + n] = np_dequantize_fp8_block(
                    *np_quantize_fp8_block(rows.T)).T
        start += n
    return out


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_operands_follow_the_format_and_phases_match_float64(recipe, dtype):
    x, ids, w, w_gate_up, w_down, dy = _inputs(dtype)
    w_gate_up_q = fp8.weight_operand(w_gate_up, recipe, 1)
    w_down_q = fp8.weight_operand(w_down, recipe, 1)
    fwd = jax.jit(fp8.forward_phases, static_argnums=5)(x, ids, w, w_gate_up_q, w_down_q,
                                                         recipe)
    bwd = jax.jit(fp8.backward_phases, static_argnums=6)(dy, x, ids, w, w_gate_up, w_down,
                                                         recipe)
    d = fp8.dispatch(ids, E)
    token, gs, valid = np.asarray(d.token), d.group_sizes, np.asarray(d.valid)
    w_rows = np.where(valid, np.asarray(w).reshape(-1)[np.asarray(d.order)], 0.0)[:, None]
    bits = np.testing.assert_array_equal

    # Operands, bitwise against the oracle.
    x32, dy32 = _np(x), _np(dy)
    bits(_np(w_gate_up_q), _oracle_weight(_np(w_gate_up), recipe, 1))
    bits(_np(w_down_q), _oracle_weight(_np(w_down), recipe, 1))
    bits(_np(bwd["w_down_h"]), _oracle_weight(_np(w_down), recipe, 2))
    bits(_np(bwd["w_gate_up_2f"]), _oracle_weight(_np(w_gate_up), recipe, 2))
    bits(_np(fwd["x_rows"]), _oracle_fake_quant(x32, recipe)[token])
    bits(_np(fwd["a_q"]), _oracle_fake_quant(_np(fwd["a"]), recipe))
    bits(_np(bwd["dy_q"]), _oracle_fake_quant(dy32, recipe)[token])
    bits(_np(bwd["dh_q"]), _oracle_fake_quant(_np(bwd["dh"]), recipe))
    masked = lambda a: np.where(valid[:, None], a, 0.0)  # noqa: E731
    bits(_np(bwd["aw_t"]), _token_block_oracle(bwd["aw"], d, recipe))
    bits(_np(bwd["dh_t"]), _token_block_oracle(bwd["dh"], d, recipe))
    bits(_np(bwd["x_t"]), _token_block_oracle(masked(x32[token]), d, recipe))
    bits(_np(bwd["dy_t"]), _token_block_oracle(masked(dy32[token]), d, recipe))

    # GEMM phases against float64 on those operands.
    _close(fwd["h"], _grouped64(fwd["x_rows"], w_gate_up_q, gs), "forward gate/up")
    _close(fwd["out"], _grouped64(fwd["a_q"], w_down_q, gs), "forward down")
    _close(fwd["y"], _rounded((masked(np.asarray(fwd["out"], np.float64)) * w_rows)[
        np.argsort(np.asarray(d.order))].reshape(T, K, H).sum(1), dtype), "combine")
    _close(bwd["g"], _grouped64(bwd["dy_q"], np.swapaxes(bwd["w_down_h"], 1, 2), gs),
           "dgrad down")
    _close(bwd["dx_rows"], _grouped64(bwd["dh_q"], np.swapaxes(bwd["w_gate_up_2f"], 1, 2), gs),
           "dgrad gate/up")
    _close(bwd["d_w_down"], _rounded(_wgrad64(bwd["aw_t"], bwd["dy_t"], gs), dtype),
           "wgrad down")
    _close(bwd["d_w_gate_up"], _rounded(_wgrad64(bwd["x_t"], bwd["dh_t"], gs), dtype),
           "wgrad gate/up")

    # The elementwise SwiGLU backward in float64 from the same h (rounded) and g.
    h = np.asarray(bwd["h"], np.float64)
    np.testing.assert_array_equal(np.asarray(bwd["h"]), _np(_np(fwd["h"]).astype(
        jnp.dtype(dtype))))
    g = np.asarray(bwd["g"], np.float64)
    hg, hu = h[:, :F], h[:, F:]
    s = 1 / (1 + np.exp(-hg))
    a = hg * s * hu
    _close(bwd["d_w"], (g * a).sum(-1), "d_w")
    da = w_rows * g
    _close(bwd["dh"], _rounded(np.concatenate([da * hu * s * (1 + hg * (1 - s)), da * hg * s],
                                              -1), dtype), "dh")
    _close(bwd["aw"], _rounded(w_rows * a, dtype), "aw")
    dx = masked(np.asarray(bwd["dx_rows"], np.float64))[np.argsort(np.asarray(d.order))]
    _close(bwd["dx"], _rounded(dx.reshape(T, K, H).sum(1), dtype), "dx")
    d_topk = np.where(valid, np.asarray(bwd["d_w"]), 0)[np.argsort(np.asarray(d.order))]
    np.testing.assert_array_equal(np.asarray(bwd["d_topk_weights"]), d_topk.reshape(T, K))


def test_token_blocks_never_span_experts():
    ids = jnp.array([[0, 1], [1, 2], [0, -1], [1, 0]] * 20, jnp.int32)  # 80 tokens
    d = fp8.dispatch(ids, 3)
    segment, count = fp8.token_segments(d, 32)
    expert = np.asarray(d.expert)
    segment = np.asarray(segment)
    counts = np.asarray(d.group_sizes)  # 60, 60, 20
    assert list(counts) == [60, 60, 20] and count == 160 // 32 + 3 + 1
    # Expert 0: blocks 0 (32 rows), 1 (28); expert 1: 2, 3; expert 2: 4; skipped rows: last.
    want = np.concatenate([np.repeat([0, 1], [32, 28]), np.repeat([2, 3], [32, 28]),
                           np.full(20, 4), np.full(20, count - 1)])
    np.testing.assert_array_equal(segment, want)
    assert (expert[segment == count - 1] == 3).all()


# --- the whole layer --------------------------------------------------------------------------

CONFIGS = {
    "softmax": dict(),
    "sigmoid_shared_capacity": dict(routing="sigmoid", num_shared_experts=1, shared_ffn_size=48,
                                    capacity_factor=1.0),
}


def _layer_grads(config, dtype, repeat: int = 1):
    """``(y, (dx, d_params))`` of a linear loss (the same dy for every layer), ``repeat`` calls
    of one compiled function."""
    params = testing.random_params(jax.random.key(0), config, dtype)
    x = jax.random.normal(jax.random.key(1), (4, T // 4, H)).astype(dtype)
    probe = jax.random.normal(jax.random.key(9), x.shape)

    def loss(x, params):
        y = jax_mok.moe(x, params)
        return jnp.sum(y.astype(jnp.float32) * probe), y

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    return [(lambda r: (r[0][1], r[1]))(fn(x, params)) for _ in range(repeat)]


@functools.cache
def _unquantized(case: str, dtype_name: str):
    config = jax_mok.MoEConfig(num_experts=E, top_k=K, hidden_size=H, ffn_size=F,
                               **CONFIGS[case])
    return _layer_grads(config, jnp.dtype(dtype_name))[0]


# Every recipe with each dtype (the FP8 layer's code differs by both), and every recipe with each
# routing config (the routing and the shared expert run outside the FP8 layer; capacity drops are
# its skipped rows): 4 cases. The former 3 x 2 product added softmax + bfloat16 for both recipes,
# a path the other cases cover, for ~20 s of compiles on 2 CPU cores.
@pytest.mark.parametrize("recipe,case,dtype", [
    ("mxfp8", "softmax", jnp.float32), ("fp8_block", "softmax", jnp.float32),
    ("mxfp8", "sigmoid_shared_capacity", jnp.bfloat16),
    ("fp8_block", "sigmoid_shared_capacity", jnp.bfloat16),
], ids=lambda v: v if isinstance(v, str) else jnp.dtype(v).name)
def test_layer_tracks_the_unquantized_layer_and_is_deterministic(recipe, case, dtype):
    y0, g0 = _unquantized(case, jnp.dtype(dtype).name)
    config = jax_mok.MoEConfig(num_experts=E, top_k=K, hidden_size=H, ffn_size=F,
                               quantization=recipe, **CONFIGS[case])
    (y1, g1), again = _layer_grads(config, dtype, repeat=2)
    for a, b in zip(jax.tree.leaves((y1, g1)), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise deterministic
    assert y1.dtype == y0.dtype == jnp.dtype(dtype) and y1.shape == y0.shape
    errors = {"y": testing.rel_error(y1, y0), "dx": testing.rel_error(g1[0], g0[0])}
    for (path, want), got in zip(jax.tree_util.tree_leaves_with_path(g0[1]),
                                 jax.tree.leaves(g1[1]), strict=True):
        assert got.dtype == want.dtype, jax.tree_util.keystr(path)
        errors[jax.tree_util.keystr(path)] = testing.rel_error(got, want)
    # Quantization touches the routed experts only: the shared expert's gradients stay those of
    # the unquantized layer, and sigmoid routing's bias has no gradient in either.
    unchanged = (".shared_gate_up", ".shared_down", ".router_bias")
    for name, err in errors.items():
        if name in unchanged:
            assert err < testing.tolerance(dtype), (name, errors)
        else:
            assert 0 < err <= LAYER_TOLERANCE, (name, errors)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("x_dtype,param_dtype", [(jnp.float32, jnp.float32),
                                                 (jnp.bfloat16, jnp.float32)])
def test_quantize_params_forward_is_bitwise_the_same(recipe, x_dtype, param_dtype):
    config = jax_mok.MoEConfig(num_experts=E, top_k=K, hidden_size=H, ffn_size=F,
                               quantization=recipe, num_shared_experts=1)
    params = testing.random_params(jax.random.key(0), config, param_dtype)
    x = jax.random.normal(jax.random.key(1), (T, H)).astype(x_dtype)
    quantized = jax_mok.quantize_params(params, recipe, dtype=x_dtype)
    forward = jax.jit(jax_mok.moe)
    np.testing.assert_array_equal(np.asarray(forward(x, quantized)),
                                  np.asarray(forward(x, params)))
    with pytest.raises(TypeError, match="pre-quantized expert weights"):
        jax.grad(lambda x: jax_mok.moe(x, quantized).astype(jnp.float32).sum())(x)


def test_vmap_matches_per_example_calls():
    config = jax_mok.MoEConfig(num_experts=E, top_k=K, hidden_size=H, ffn_size=F,
                               quantization="mxfp8")
    params = testing.random_params(jax.random.key(0), config, jnp.float32)
    xs = jax.random.normal(jax.random.key(1), (3, 16, H))
    loss = lambda x, p: jnp.sum(jax_mok.moe(x, p) ** 2)  # noqa: E731
    batched = jax.jit(jax.vmap(lambda x: jax_mok.moe(x, params)))(xs)
    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(0, None)))(xs, params)
    forward, grad = jax.jit(jax_mok.moe), jax.jit(jax.grad(loss, argnums=(0, 1)))
    for i in range(xs.shape[0]):
        assert testing.rel_error(batched[i], forward(xs[i], params)) < 1e-6
        want = grad(xs[i], params)
        for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
            assert testing.rel_error(got[i], ref) < 1e-6


def test_flax_modules_pass_the_config_through():
    nnx = pytest.importorskip("flax.nnx")
    import jax_mok.linen
    import jax_mok.nnx

    config = jax_mok.MoEConfig(num_experts=E, top_k=K, hidden_size=H, ffn_size=F,
                               quantization="fp8_block")
    x = jax.random.normal(jax.random.key(1), (2, 8, H))
    layer = jax_mok.nnx.MoE(config, rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(np.asarray(nnx.jit(lambda m, x: m(x))(layer, x)),
                                  np.asarray(jax.jit(jax_mok.moe)(x, layer.to_params())))
    module = jax_mok.linen.MoE(config, sow_aux=False)
    variables = jax.jit(module.init)(jax.random.key(0), x)
    assert jax.jit(module.apply)(variables, x).shape == x.shape


def test_expert_parallel_xla_matches_single_device(monkeypatch):
    config = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=64, ffn_size=48,
                               quantization="mxfp8", capacity_factor=1.5,
                               fp8_weight_gradients="fp8")
    params = testing.random_params(jax.random.key(0), config, jnp.float32)
    x = jax.random.normal(jax.random.key(1), (64, 64))
    mesh = cpu_devices.mesh((1, 2), ("data", "expert"))

    def loss(x, p, **kw):
        return jnp.sum(jax_mok.moe(x, p, **kw) ** 2)

    want = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, params)
    got = jax.jit(jax.value_and_grad(lambda x, p: loss(x, p, mesh=mesh, transport="xla"),
                                     argnums=(0, 1)))(x, params)
    # Each expert sees its rows in the same order (source devices hold consecutive tokens), so
    # the token blocks of the weight gradients match: only float32 summation order differs.
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert testing.rel_error(a, b) < testing.tolerance(jnp.float32)
    # The default (None) runs "fp8" under expert parallelism, and says so once.
    default = dataclasses.replace(params, config=dataclasses.replace(config,
                                                                     fp8_weight_gradients=None))
    monkeypatch.setattr(jax_mok.warn, "_warned", set())  # a warning already given elsewhere
    with pytest.warns(UserWarning, match=r"fp8_weight_gradients=None\) runs 'fp8'"):
        got_default = jax.jit(jax.value_and_grad(
            lambda x, p: loss(x, p, mesh=mesh, transport="xla"), argnums=(0, 1)))(x, default)
    for a, b in zip(jax.tree.leaves(got_default), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Pre-quantized experts travel through shard_map as QuantizedWeight pytrees.
    params = dataclasses.replace(params, config=dataclasses.replace(config,
                                                                    quantization="fp8_block"))
    quantized = jax_mok.quantize_params(params, "fp8_block")
    y = jax.jit(lambda x, p: jax_mok.moe(x, p, mesh=mesh, transport="xla"))(x, quantized)
    assert testing.rel_error(y, jax.jit(jax_mok.moe)(x, params)) < testing.tolerance(
        jnp.float32)
    # The peer transport's FP8 path: tests/test_peer_transport.py (here it is not available).
    with pytest.raises(NotImplementedError, match="transport='peer' is not available here"):
        jax_mok.moe(x, params, mesh=mesh, transport="peer")


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"quantization must be one of .*got 'fp4'"):
        jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=64, ffn_size=32,
                          quantization="fp4")
    config = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=64, ffn_size=32)
    params = jax_mok.init_params(jax.random.key(0), config, jnp.float32)
    x = jnp.ones((8, 64))
    quantized = jax_mok.quantize_params(params, "mxfp8")
    with pytest.raises(ValueError, match=r"config.quantization is None; use MoEConfig\("):
        jax_mok.moe(x, dataclasses.replace(quantized, config=config))
    other = dataclasses.replace(config, quantization="fp8_block")
    with pytest.raises(ValueError, match="quantized with recipe 'mxfp8' but config.quantization"):
        jax_mok.moe(x, dataclasses.replace(quantized, config=other))
    with pytest.raises(TypeError, match="both be QuantizedWeights or both be arrays"):
        jax_mok.moe(x, dataclasses.replace(quantized, w_down=params.w_down))
    ids, w = testing.random_routing(jax.random.key(1), 8, 4, 2)
    args = (x, ids, w, params.w_gate_up, params.w_down)
    with pytest.raises(ValueError, match="recipe must be one of"):
        fp8.routed_experts_fp8(*args, "e5m2")
    with pytest.raises(ValueError, match="implementation must be one of"):
        kernels_fp8.routed_experts_fp8(*args, "mxfp8", implementation="triton")
    with pytest.raises(ValueError, match=r"expected w_gate_up \[E, H=64, 2F\]"):
        fp8.routed_experts_fp8(x, ids, w, params.w_down, params.w_down, "mxfp8")
    with pytest.raises(ValueError, match=r"topk_ids and topk_weights must both be \[T=8, k\]"):
        fp8.routed_experts_fp8(x, ids[:4], w, params.w_gate_up, params.w_down, "mxfp8")


def test_output_and_gradient_dtypes():
    x, ids, w, w_gate_up, w_down, dy = _inputs(jnp.bfloat16)

    def layer(x, w, w_gate_up, w_down):
        return fp8.routed_experts_fp8(x, ids, w, w_gate_up, w_down, "fp8_block")

    y, (dx, dw, dgu, dd) = jax.jit(lambda *a: (lambda y, vjp: (y, vjp(dy)))(
        *jax.vjp(layer, *a)))(x, w, w_gate_up, w_down)
    assert y.dtype == dx.dtype == dgu.dtype == dd.dtype == jnp.bfloat16
    assert dw.dtype == jnp.float32 and dw.shape == w.shape


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_unquantized_weight_gradients(recipe, dtype):
    """``fp8_weight_gradients="unquantized"``: the weight gradients are float64 products of the
    backward's own aw, dh (rounded to x's dtype) and the unquantized x, dy rows; everything else
    is bitwise the default backward's."""
    x, ids, w, w_gate_up, w_down, dy = _inputs(dtype)
    fp8_phases = fp8.backward_phases(dy, x, ids, w, w_gate_up, w_down, recipe)
    un = fp8.backward_phases(dy, x, ids, w, w_gate_up, w_down, recipe,
                             weight_grads="unquantized")
    for name in ("dx", "d_topk_weights", "dh", "aw", "g"):
        np.testing.assert_array_equal(_np(un[name]), _np(fp8_phases[name]), err_msg=name)
    d = fp8.dispatch(ids, E)
    valid = np.asarray(d.valid)[:, None]
    rows = lambda t: np.where(valid, _np(t, np.float64), 0.0)  # noqa: E731
    want_dn = _wgrad64(rows(un["aw"]), rows(jnp.asarray(dy)[d.token]), d.group_sizes)
    want_gu = _wgrad64(rows(jnp.asarray(x)[d.token]), rows(un["dh"]), d.group_sizes)
    assert un["d_w_down"].dtype == w_down.dtype and un["d_w_gate_up"].dtype == w_gate_up.dtype
    tol = PHASE_TOLERANCE if dtype == jnp.float32 else 1e-2  # the result rounded to bf16
    _close(un["d_w_down"], want_dn, "d_w_down", tol)
    _close(un["d_w_gate_up"], want_gu, "d_w_gate_up", tol)
    # and it differs from the FP8 weight gradients by about E4M3's error, not more
    for name in ("d_w_down", "d_w_gate_up"):
        err = testing.rel_error(un[name], np.asarray(_np(fp8_phases[name], np.float64)))
        assert 1e-3 < err < LAYER_TOLERANCE, f"{name}: {err:.2e}"


def test_unquantized_weight_gradients_through_the_api():
    config = jax_mok.MoEConfig(num_experts=E, top_k=K, hidden_size=H, ffn_size=F,
                               quantization="fp8_block", fp8_weight_gradients="fp8")
    base = _layer_grads(config, jnp.float32)[0]
    un = _layer_grads(dataclasses.replace(config, fp8_weight_gradients="unquantized"),
                      jnp.float32)[0]
    default = _layer_grads(dataclasses.replace(config, fp8_weight_gradients=None),
                           jnp.float32)[0]  # None: "unquantized" on one device
    for a, b in zip(jax.tree.leaves(default), jax.tree.leaves(un), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    y0, (dx0, p0) = base
    y1, (dx1, p1) = un
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y0))  # the forward is the same
    np.testing.assert_array_equal(np.asarray(dx1), np.asarray(dx0))  # so are data gradients
    for name in ("w_gate_up", "w_down"):
        a, b = getattr(p1, name), getattr(p0, name)
        assert 1e-3 < testing.rel_error(a, np.asarray(b, np.float64)) < LAYER_TOLERANCE, name
    with pytest.raises(ValueError, match="fp8_weight_gradients must be None or one of"):
        dataclasses.replace(config, fp8_weight_gradients="bf16")
    with pytest.raises(ValueError, match="weight_grads"):
        fp8.routed_experts_fp8(*_inputs(jnp.float32)[:5], "mxfp8", weight_grads="bf16")


def test_unquantized_weight_gradients_refuse_expert_parallelism():
    config = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=64, ffn_size=48,
                               quantization="mxfp8", fp8_weight_gradients="unquantized")
    params = testing.random_params(jax.random.key(0), config, jnp.float32)
    x = jax.random.normal(jax.random.key(1), (64, 64))
    mesh = cpu_devices.mesh((1, 2), ("data", "expert"))
    with pytest.raises(NotImplementedError, match="no expert-parallel path"):
        jax_mok.moe(x, params, mesh=mesh, transport="xla")
