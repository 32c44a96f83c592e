"""mxfp8 through the BF16 GEMMs (``jax_mok.quantization.cuda.routed_experts_mx_bf16_cuda``) on the
CPU machine: the differentiated call lowers for CUDA to the ``mok_moe_*_mx`` targets and no FP8
GEMM target (with prepared weights: no weight quantizer either), and the choices it cannot run are
refused with errors that name them. Its values run on a GPU: tests/test_cuda_mx_bf16.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jax_mok
from jax_mok import testing
from jax_mok.quantization import cuda as fp8_cuda

E, K, H, F, T = 4, 2, 256, 128, 64  # H, F multiples of 128: the kernels' sizes


def _args(dtype=jnp.bfloat16):
    config = jax_mok.MoEConfig(num_experts=E, top_k=K, hidden_size=H, ffn_size=F,
                               quantization="mxfp8")
    params = testing.random_params(jax.random.key(0), config, dtype)
    x = jax.random.normal(jax.random.key(1), (T, H)).astype(dtype)
    ids = jnp.tile(jnp.arange(K, dtype=jnp.int32), (T, 1))
    w = jnp.full((T, K), 0.5, jnp.float32)
    return config, params, x, ids, w


def _call(x, ids, w, wgu, wd, prepared=None, **kw):
    kw = dict(dict(implementation="cuda", weight_grads="unquantized", mx_gemm="bf16"), **kw)
    return fp8_cuda.routed_experts_fp8(x, ids, w, wgu, wd, "mxfp8", prepared=prepared, **kw)


def _lowered_grad(prepared: bool = False):
    _, params, x, ids, w = _args()

    def loss(x, w, wgu, wd):
        pw = fp8_cuda.mx_bf16_weights(wgu, wd) if prepared else None
        return jnp.sum(_call(x, ids, w, wgu, wd, pw).astype(jnp.float32) ** 2)

    grad = jax.grad(loss, argnums=(0, 1, 2, 3))
    args = (x, w, params.w_gate_up, params.w_down)
    return jax.jit(grad).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.fixture
def cuda_built():
    from jax_mok.kernels import _ffi

    if not _ffi.kernels_built("cuda"):
        pytest.skip("jax_mok._mok_cuda is not built")


def test_lowers_to_the_mx_targets(cuda_built):
    text = _lowered_grad()
    assert "mok_moe_fwd_train_mx" in text and "mok_moe_bwd_saved_mx" in text
    assert "_fp8" not in text  # no FP8 GEMM target: mok_moe_fwd_train_fp8, mok_moe_bwd_*_fp8
    assert "mok_quantize" not in text  # x, dy, the weights: deq(Q(.)) by mok_mx_qdq
    assert text.count("mok_mx_qdq") == 6  # x, dy, and each weight along both of its axes


def test_prepared_weights(cuda_built):
    """With MxBf16Weights made in the step, the layer itself qdq's x and dy only; an Fp8Weights
    (the promoted path's layouts) is refused."""
    text = _lowered_grad(prepared=True)
    assert "mok_moe_fwd_train_mx" in text and "mok_moe_bwd_saved_mx" in text
    assert text.count("mok_mx_qdq") == 6  # 4 made by mx_bf16_weights, x and dy by the layer
    _, params, x, ids, w = _args()
    fp8 = jax_mok.fp8_weights(params, implementation="reference")
    with pytest.raises(TypeError, match="MxBf16Weights"):
        _call(x, ids, w, params.w_gate_up, params.w_down, fp8)


def test_refuses_what_it_cannot_run(cuda_built):
    _, params, x, ids, w = _args()
    wgu, wd = params.w_gate_up, params.w_down
    with pytest.raises(ValueError, match="mx_gemm must be"):
        _call(x, ids, w, wgu, wd, mx_gemm="bf8")
    with pytest.raises(ValueError, match="needs bfloat16 x"):
        _call(x.astype(jnp.float32), ids, w, wgu.astype(jnp.float32), wd.astype(jnp.float32))
    with pytest.raises(ValueError, match="fp8_weight_gradients='unquantized'"):
        _call(x, ids, w, wgu, wd, weight_grads="fp8")


def test_fp8_recipe_block_ignores_mx_gemm(cuda_built):
    """``mx_gemm`` is mxfp8's choice: fp8_block lowers to its FP8 targets whatever it says."""
    _, params, x, ids, w = _args()
    fn = lambda x: fp8_cuda.routed_experts_fp8(
        x, ids, w, params.w_gate_up, params.w_down, "fp8_block", implementation="cuda",
        weight_grads="unquantized", mx_gemm="bf16")
    text = jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "mok_moe_fwd_fp8" in text and "_mx" not in text


def test_prequantized_weights_forward_lowers_to_no_weight_quantizer(cuda_built):
    """quantize_params' inference layouts (the forward's axes) are dequantized, not requantized."""
    config, params, x, ids, w = _args()
    q = jax_mok.quantize_params(params, "mxfp8", implementation="reference")
    fn = lambda x: _call(x, ids, w, q.w_gate_up, q.w_down)
    text = jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "mok_moe_fwd_mx" in text and "mok_quantize_weight" not in text
