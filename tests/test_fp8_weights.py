"""``jax_mok.fp8_weights``: the expert weights' FP8 layouts made once, read by ``jax_mok.moe(...,
fp8_weights=w)`` instead of quantizing in every call.

- values and every gradient (which still reach ``params``) equal the plain call's, bit for bit,
  for both recipes, float32 / bfloat16 activations and float32 master weights;
- the differentiated step with prepared weights quantizes no weight-sized tensor (its jaxpr holds
  no FP8 array of a weight's size; the plain step's does), and on CUDA it lowers to no weight
  quantizer call (checked from the lowered program where the CUDA extension is built);
- a micro-batch ``lax.scan`` with one ``fp8_weights`` per step equals summing the plain calls'
  gradients;
- the errors name the problem.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mok
import jax_mok.linen
import jax_mok.nnx
from jax_mok import testing

E, K, H, F, T = 4, 2, 256, 128, 64  # H, F multiples of 128: the CUDA kernels' sizes too


def _config(recipe, **extra):
    return jax_mok.MoEConfig(num_experts=E, top_k=K, hidden_size=H, ffn_size=F,
                             quantization=recipe, **extra)


def _step(config, dtype, param_dtype=jnp.float32, prepared: bool = True):
    params = testing.random_params(jax.random.key(0), config, param_dtype)
    x = jax.random.normal(jax.random.key(1), (2, T // 2, H)).astype(dtype)
    probe = jax.random.normal(jax.random.key(2), x.shape)

    def loss(x, params, w):
        y = jax_mok.moe(x, params, fp8_weights=w)
        return jnp.sum(y.astype(jnp.float32) * probe), y

    grad = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    w = jax_mok.fp8_weights(params, dtype=dtype) if prepared else None
    (_, y), g = jax.jit(grad)(x, params, w)
    return params, x, w, y, g


@pytest.mark.parametrize("recipe", jax_mok.quantization.RECIPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_values_and_gradients_equal_the_plain_call(recipe, dtype):
    config = _config(recipe, num_shared_experts=1)
    *_, y0, g0 = _step(config, dtype, prepared=False)
    _, _, w, y1, g1 = _step(config, dtype)
    assert w.backward and w.recipe == recipe and w.dtype == jnp.dtype(dtype).name
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y0))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g1),
                            strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, jax.tree_util.keystr(path)
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a),
                                      err_msg=jax.tree_util.keystr(path))
    # The gradient reaches the master weights (nonzero, float32 like them).
    assert g1[1].w_gate_up.dtype == jnp.float32 and float(jnp.abs(g1[1].w_gate_up).max()) > 0


def test_layouts_are_the_quantizers_bits():
    config = _config("mxfp8")
    params = testing.random_params(jax.random.key(3), config, jnp.bfloat16)
    w = jax_mok.fp8_weights(params)
    want = {
        "gate_up": (params.w_gate_up, 1), "gate_up_t": (params.w_gate_up, 2),
        "down": (params.w_down, 1), "down_t": (params.w_down, 2),
    }
    for name, (array, axis) in want.items():
        got = getattr(w, name)
        ref = jax_mok.QuantizedWeight.quantize(array, "mxfp8", axis)
        if w.form == "bf16":  # on a GPU: the layouts of mxfp8 through the BF16 GEMMs
            pairs = ((got, ref.dequantize().astype(jnp.bfloat16)),)
        else:
            assert got.reduction_axis == axis
            pairs = ((got.values, ref.values), (got.scales, ref.scales))
        for a, b in pairs:
            np.testing.assert_array_equal(np.asarray(a).view(np.uint8),
                                          np.asarray(b).view(np.uint8), err_msg=name)
    fwd_only = jax_mok.fp8_weights(params, backward=False)
    assert not fwd_only.backward and fwd_only.gate_up_t is None
    assert fwd_only.nbytes() * 2 == w.nbytes()


def _weight_sized_fp8(jaxpr, sizes) -> int:
    """Quantizations of a weight-sized tensor at any depth: conversions or bit casts to float8
    (jax_mok.quantization's E4M3 rounding ends in a bit cast from uint8; the dequantizers only
    reshape FP8 arrays) and calls of the CUDA weight quantizer (``mok_quantize_weight*``) whose
    output has one of ``sizes`` elements, and the CUDA quantize-dequantize pass of mxfp8 through
    the BF16 GEMMs (``mok_mx_qdq``, bf16 output) of that size."""
    count = 0
    for eqn in jaxpr.eqns:
        for value in eqn.params.values():  # nested jaxprs: pjit, custom_vjp, scan, ...
            values = value if isinstance(value, tuple | list) else (value,)
            for v in values:
                inner = getattr(v, "jaxpr", v)
                if hasattr(inner, "eqns"):
                    count += _weight_sized_fp8(inner, sizes)
        target = str(eqn.params.get("target_name", "")) if eqn.primitive.name == "ffi_call" else ""
        quantizer = eqn.primitive.name in ("convert_element_type", "bitcast_convert_type") or (
            target.startswith("mok_quantize_weight"))
        if not (quantizer or target == "mok_mx_qdq"):
            continue
        for v in eqn.outvars:
            aval = v.aval
            fp8 = aval.dtype == jnp.float8_e4m3fn or target == "mok_mx_qdq"
            if fp8 and int(np.prod(aval.shape)) in sizes:
                count += 1
    return count


@pytest.mark.parametrize("recipe", jax_mok.quantization.RECIPES)
def test_prepared_step_quantizes_no_weight(recipe):
    config = _config(recipe)
    params = testing.random_params(jax.random.key(0), config, jnp.float32)
    x = jax.random.normal(jax.random.key(1), (T, H)).astype(jnp.bfloat16)
    w = jax_mok.fp8_weights(params, dtype=jnp.bfloat16)
    sizes = {E * H * 2 * F, E * F * H}

    def loss(params, w):
        return jnp.sum(jax_mok.moe(x, params, fp8_weights=w).astype(jnp.float32) ** 2)

    prepared = jax.make_jaxpr(jax.grad(loss))(params, w).jaxpr
    plain = jax.make_jaxpr(jax.grad(lambda p: loss(p, None)))(params).jaxpr
    assert _weight_sized_fp8(plain, sizes) > 0  # the check sees the plain step's quantization
    assert _weight_sized_fp8(prepared, sizes) == 0


def test_cuda_lowering_calls_no_weight_quantizer():
    """Where the CUDA extension is built (CI builds it), lower the differentiated step for the
    CUDA platform: the prepared step calls the FP8 kernels and no ``mok_quantize_weight*``."""
    from jax_mok.kernels import _ffi

    if not _ffi.kernels_built("cuda"):
        pytest.skip("jax_mok._mok_cuda is not built")
    config = _config("fp8_block")
    params = testing.random_params(jax.random.key(0), config, jnp.float32)
    x = jnp.ones((T, H), jnp.bfloat16)
    w = jax_mok.fp8_weights(params, dtype=jnp.bfloat16, implementation="reference")

    def loss(params, w):
        y = jax_mok.moe(x, params, fp8_weights=w, implementation="cuda")
        return jnp.sum(y.astype(jnp.float32) ** 2)

    def lowered(fn, *args):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    prepared = lowered(jax.grad(loss), params, w)
    plain = lowered(jax.grad(lambda p: loss(p, None)), params)
    assert "mok_moe_bwd" in prepared and "mok_quantize" in prepared  # x and dy rows only
    assert "mok_quantize_weight" not in prepared
    assert "mok_quantize_weight_both" in plain


def test_microbatch_scan_equals_summed_plain_gradients():
    config = _config("fp8_block")
    params = testing.random_params(jax.random.key(0), config, jnp.float32)
    xs = jax.random.normal(jax.random.key(1), (3, T, H)).astype(jnp.bfloat16)

    def loss(params, x, w=None):
        return jnp.sum(jax_mok.moe(x, params, fp8_weights=w).astype(jnp.float32) ** 2)

    @jax.jit
    def accumulated(params, xs):
        w = jax_mok.fp8_weights(params, dtype=jnp.bfloat16)  # once per optimizer step

        def micro(acc, x):
            g = jax.grad(loss)(params, x, w)
            return jax.tree.map(jnp.add, acc, g), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        return jax.lax.scan(micro, zeros, xs)[0]

    got = accumulated(params, xs)
    want = jax.tree.map(jnp.zeros_like, params)
    plain_grad = jax.jit(jax.grad(loss))  # compiled once for the micro-batches
    for i in range(xs.shape[0]):
        want = jax.tree.map(jnp.add, want, plain_grad(params, xs[i]))
    # Not bitwise: the scanned and the unrolled programs may sum the shared router's and the
    # token reductions in another order (seen on XLA:GPU: 2e-5 relative on the router gradient).
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_quantized_inside_the_loss_gives_the_same_gradients():
    """fp8_weights made inside the differentiated function: stop_gradient keeps it out of the
    gradient, which reaches params through the layer only."""
    config = _config("mxfp8")
    params = testing.random_params(jax.random.key(0), config, jnp.float32)
    x = jax.random.normal(jax.random.key(1), (T, H))

    def inside(params):
        w = jax_mok.fp8_weights(params)
        return jnp.sum(jax_mok.moe(x, params, fp8_weights=w) ** 2)

    def plain(params):
        return jnp.sum(jax_mok.moe(x, params) ** 2)

    for a, b in zip(jax.tree.leaves(jax.jit(jax.grad(inside))(params)),
                    jax.tree.leaves(jax.jit(jax.grad(plain))(params)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_errors_name_the_problem():
    config = _config("fp8_block")
    params = testing.random_params(jax.random.key(0), config, jnp.float32)
    x = jnp.ones((T, H), jnp.bfloat16)
    with pytest.raises(ValueError, match="quantization is None"):
        jax_mok.fp8_weights(testing.random_params(jax.random.key(0), _config(None)))
    with pytest.raises(ValueError, match="dtype=jnp.bfloat16"):
        jax_mok.moe(x, params, fp8_weights=jax_mok.fp8_weights(params))  # float32 layouts
    mx = jax_mok.fp8_weights(testing.random_params(jax.random.key(0), _config("mxfp8")),
                             dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="recipe 'mxfp8'"):
        jax_mok.moe(x, params, fp8_weights=mx)
    with pytest.raises(TypeError, match="result of jax_mok.fp8_weights"):
        jax_mok.moe(x, params, fp8_weights=params.w_gate_up)
    with pytest.raises(TypeError, match="already quantized"):
        jax_mok.fp8_weights(jax_mok.quantize_params(params, "fp8_block"))
    fwd_only = jax_mok.fp8_weights(params, dtype=jnp.bfloat16, backward=False)
    jax.block_until_ready(jax_mok.moe(x, params, fp8_weights=fwd_only))  # inference is fine
    with pytest.raises(TypeError, match="backward=False"):
        jax.grad(lambda p: jnp.sum(jax_mok.moe(x, p, fp8_weights=fwd_only).astype(
            jnp.float32)))(params)


def test_quantize_params_lowers_to_the_cuda_weight_quantizer():
    """On the CUDA platform quantize_params runs the weight quantizer kernel (one pass, no
    transposed copy of the weight in XLA), as fp8_weights does; "reference" keeps it in XLA;
    a bad implementation names the function."""
    from jax_mok.kernels import _ffi

    params = testing.random_params(jax.random.key(0), _config(None), jnp.float32)
    with pytest.raises(ValueError, match="quantize_params: implementation must be"):
        jax_mok.quantize_params(params, "fp8_block", implementation="gpu")
    if not _ffi.kernels_built("cuda"):
        pytest.skip("jax_mok._mok_cuda is not built")

    def lowered(implementation):
        fn = lambda p: jax_mok.quantize_params(  # noqa: E731
            p, "fp8_block", dtype=jnp.bfloat16, implementation=implementation)
        return jax.jit(fn).trace(params).lower(lowering_platforms=("cuda",)).as_text()

    assert "mok_quantize_weight" in lowered("cuda")
    assert "mok_quantize_weight" not in lowered("reference")


def test_flax_modules_take_fp8_weights():
    from flax import nnx

    config = _config("fp8_block")
    x = jax.random.normal(jax.random.key(1), (T, H))
    layer = jax_mok.nnx.MoE(config, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    w = layer.fp8_weights()
    assert w.dtype == "bfloat16" and w.backward
    np.testing.assert_array_equal(np.asarray(layer(x, fp8_weights=w)), np.asarray(layer(x)))

    module = jax_mok.linen.MoE(config, dtype=jnp.bfloat16)
    variables = module.init(jax.random.key(0), x)
    w = jax_mok.linen.fp8_weights(variables["params"], config, dtype=jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(module.apply(variables, x, fp8_weights=w)),
                                  np.asarray(module.apply(variables, x)))
    with pytest.raises(KeyError, match="w_gate_up"):
        jax_mok.linen.fp8_weights({"router": variables["params"]["router"]}, config,
                                  dtype=jnp.bfloat16)


@pytest.mark.parametrize("save", [True, False])
def test_cuda_backward_keeps_the_forward_layout_only_to_recompute(save):
    """The saved-h backward (``mok_moe_bwd_saved_fp8``) reads h, not the forward's gate/up layout,
    so that layout is no operand of it and dies with the forward (on S4 that is 15.75 GiB less
    held to the backward); the recomputing backward (``mok_moe_bwd_fp8``) takes it. Checked on
    the program lowered for CUDA where the extension is built."""
    import re

    from jax_mok.kernels import _ffi

    if not _ffi.kernels_built("cuda"):
        pytest.skip("jax_mok._mok_cuda is not built")
    config = _config("fp8_block", save_activations=save)
    params = testing.random_params(jax.random.key(0), config, jnp.float32)
    x = jnp.ones((T, H), jnp.bfloat16)

    def loss(params):
        y = jax_mok.moe(x, params, implementation="cuda")
        return jnp.sum(y.astype(jnp.float32) ** 2)

    text = jax.jit(jax.grad(loss)).trace(params).lower(lowering_platforms=("cuda",)).as_text()
    target = "mok_moe_bwd_saved_fp8" if save else "mok_moe_bwd_fp8"
    calls = [ln for ln in text.splitlines() if re.search(rf"@{target}\b", ln)]
    assert len(calls) == 1, (target, [ln[:160] for ln in calls])
    # dy + quantized dy (2) + x + quantized x (2) + ids + weights, then the layouts (2 each):
    # saved: the two backward layouts and h; recomputing: the forward gate/up layout too.
    operands = re.search(rf"@{target}\((.*?)\)", calls[0]).group(1)
    count = len([o for o in operands.split(",") if o.strip()])
    assert count == (13 if save else 14), (count, calls[0][:300])
    other = "mok_moe_bwd_fp8" if save else "mok_moe_bwd_saved_fp8"
    assert not re.search(rf"@{other}\b", text)
