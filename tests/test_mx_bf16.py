"""mxfp8 through the BF16 GEMMs (``jax_mok.quantization.cuda.routed_experts_mx_bf16_cuda``), on
the CPU machine: where it is mxfp8's path (bf16 x, unquantized weight gradients) and where the
promoted FP8 kernels run instead, from the program lowered for CUDA; ``fp8_weights`` and the
layouts each path reads; the pure-JAX layer with the bf16 layouts. Its values on a GPU:
tests/test_cuda_mx_bf16.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mok
from jax_mok import testing
from jax_mok.quantization import blocks, layer
from jax_mok.quantization import cuda as fp8_cuda
from jax_mok.quantization.weights import Fp8Weights, mx_bf16_weights

E, K, H, F, T = 4, 2, 256, 128, 64  # H, F multiples of 128: the kernels' sizes


def _args(dtype=jnp.bfloat16):
    config = jax_mok.MoEConfig(num_experts=E, top_k=K, hidden_size=H, ffn_size=F,
                               quantization="mxfp8")
    params = testing.random_params(jax.random.key(0), config, dtype)
    x = jax.random.normal(jax.random.key(1), (T, H)).astype(dtype)
    ids = jnp.tile(jnp.arange(K, dtype=jnp.int32), (T, 1))
    w = jnp.full((T, K), 0.5, jnp.float32)
    return config, params, x, ids, w


def _call(x, ids, w, wgu, wd, prepared=None, weight_grads="unquantized"):
    return fp8_cuda.routed_experts_fp8(x, ids, w, wgu, wd, "mxfp8", implementation="cuda",
                                       prepared=prepared, weight_grads=weight_grads)


def _lowered_grad(dtype=jnp.bfloat16, prepared: bool = False, weight_grads="unquantized"):
    _, params, x, ids, w = _args(dtype)

    def loss(x, w, wgu, wd):
        pw = mx_bf16_weights(wgu, wd) if prepared else None
        y = _call(x, ids, w, wgu, wd, pw, weight_grads)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    grad = jax.grad(loss, argnums=(0, 1, 2, 3))
    args = (x, w, params.w_gate_up, params.w_down)
    return jax.jit(grad).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.fixture
def cuda_built():
    from jax_mok.kernels import _ffi

    if not _ffi.kernels_built("cuda"):
        pytest.skip("jax_mok._mok_cuda is not built")


def test_bf16_x_with_unquantized_weight_gradients_lowers_to_the_mx_targets(cuda_built):
    text = _lowered_grad()
    assert "mok_moe_fwd_train_mx" in text and "mok_moe_bwd_saved_mx" in text
    assert "_fp8" not in text  # no FP8 GEMM target: mok_moe_fwd_train_fp8, mok_moe_bwd_*_fp8
    assert "mok_quantize" not in text  # x, dy, the weights: deq(Q(.)) by mok_mx_qdq
    # x, dy and the forward's two weight layouts; the backward makes its two in its scratch
    assert text.count("mok_mx_qdq") == 4
    assert "qdq_weights = 1" in text


@pytest.mark.parametrize("dtype,weight_grads", [(jnp.float32, "unquantized"),
                                                (jnp.bfloat16, "fp8")])
def test_otherwise_the_promoted_fp8_kernels(cuda_built, dtype, weight_grads):
    text = _lowered_grad(dtype, weight_grads=weight_grads)
    assert "mok_moe_fwd_train_fp8" in text and "_mx" not in text


def test_prepared_bf16_layouts(cuda_built):
    """With the bf16 layouts made in the step, the layer itself qdq's x and dy only."""
    text = _lowered_grad(prepared=True)
    assert "mok_moe_fwd_train_mx" in text and "mok_moe_bwd_saved_mx" in text
    assert text.count("mok_mx_qdq") == 6  # 4 made by mx_bf16_weights, x and dy by the layer
    assert "qdq_weights = 0" in text


def test_fp8_weights_make_the_layouts_of_the_path(cuda_built, monkeypatch):
    """jax_mok.fp8_weights on the CUDA path: bf16 layouts for bf16 with unquantized weight
    gradients (traced: the lowering needs no GPU), FP8 ones otherwise; a call given the other
    form says which to make."""
    config, params, x, ids, w = _args()
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    bf16 = jax.eval_shape(lambda p: jax_mok.fp8_weights(p, dtype=jnp.bfloat16), params)
    assert bf16.form == "bf16" and bf16.gate_up.dtype == jnp.bfloat16
    assert tuple(bf16.gate_up.shape) == (E, H, 2 * F) and tuple(bf16.down_t.shape) == (E, F, H)
    f32 = jax.eval_shape(lambda p: jax_mok.fp8_weights(p, dtype=jnp.float32), params)
    assert f32.form == "fp8"
    fp8_form = jax_mok.fp8_weights(params, implementation="reference")
    with pytest.raises(TypeError, match="read the bf16 ones"):
        _call(x, ids, w, params.w_gate_up, params.w_down, fp8_form)
    with pytest.raises(TypeError, match="read the FP8 ones"):
        _call(x, ids, w, params.w_gate_up, params.w_down, bf16, weight_grads="fp8")


def test_prequantized_weights_forward_stays_on_the_fp8_kernels(cuda_built):
    """quantize_params' inference layouts are read as E4M3 bytes by the FP8 kernels: neither
    requantized nor dequantized (no weight-sized pass per call)."""
    config, params, x, ids, w = _args()
    q = jax_mok.quantize_params(params, "mxfp8", implementation="reference")
    fn = lambda x: _call(x, ids, w, q.w_gate_up, q.w_down)
    text = jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "mok_moe_fwd_fp8" in text and "_mx" not in text
    assert "mok_quantize_weight" not in text


def test_reference_layer_reads_bf16_layouts():
    """The pure-JAX layer given the bf16 layouts (deq(Q(w)) along each axis, as the CUDA path
    makes them) computes the plain call's values and gradients bit for bit."""
    _, params, x, ids, w = _args()
    wgu, wd = params.w_gate_up, params.w_down
    qdq = lambda a, axis: blocks.fake_quantize(a, "mxfp8", axis).astype(jnp.bfloat16)
    prepared = Fp8Weights(qdq(wgu, 1), qdq(wd, 1), qdq(wgu, 2), qdq(wd, 2), "mxfp8", "bfloat16",
                          "bf16")

    def run(pw):
        def f(x, w, wgu, wd):
            y = layer.routed_experts_fp8(x, ids, w, wgu, wd, "mxfp8", prepared=pw,
                                         weight_grads="unquantized")
            return jnp.sum(y.astype(jnp.float32) ** 2), y
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True))(x, w, wgu, wd)

    (_, y0), g0 = run(None)
    (_, y1), g1 = run(prepared)
    for a, b in zip((y0, *g0), (y1, *g1), strict=True):
        assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
