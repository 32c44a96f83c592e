"""Expert weights quantized once per optimizer step: :func:`fp8_weights` and :class:`Fp8Weights`.

The expert weights are the largest tensors of a fine-grained MoE layer, and the FP8 layer reads
them in up to four FP8 layouts per training step (two per weight: the forward's and the data
gradients'). Quantizing them is memory-bound work of a few bytes per weight; with gradient
accumulation over micro-batches, or a model that calls the layer several times per step, doing
it once per optimizer step instead of once per call is what lets FP8 pay::

    w = jax_mok.fp8_weights(params, dtype=jnp.bfloat16)      # once per optimizer step
    def micro_step(grads, x):                                 # lax.scan over micro-batches
        g = jax.grad(lambda p: loss(jax_mok.moe(x, p, fp8_weights=w)))(params)
        return jax.tree.map(jnp.add, grads, g), None

``jax_mok.moe(x, params, fp8_weights=w)`` computes the same values and the same gradients (with
respect to ``params``, bit for bit) as ``jax_mok.moe(x, params)`` with ``params`` as they were
when ``w`` was made: the quantization is a pure function of the weights, done here instead of
inside the call. ``w`` is a cache, not a parameter: it is never differentiated, and if
``params`` change after it was made (an optimizer update) the call uses the old quantized
weights until ``w`` is made again — the user's choice, like any cache.

On CUDA the weights are quantized by one kernel pass per weight that reads it once and writes
every layout (``mok_quantize_weight_both``); elsewhere by :mod:`jax_mok.quantization`
(the same bits).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_mok.kernels import targets
from jax_mok.params import MoEParams
from jax_mok.quantization import cuda
from jax_mok.quantization.blocks import QuantizedWeight
from jax_mok.quantization.format import check_recipe


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Fp8Weights:
    """The quantized layouts of one layer's expert weights, in one of two forms (``form``):

    ``"fp8"``: each a :class:`QuantizedWeight`, reduction axis last in its stored ``values``:

    - ``gate_up``: ``w_gate_up [E, H, 2F]`` along H, stored ``[E, 2F, H]`` (the gate/up GEMM);
    - ``down``: ``w_down [E, F, H]`` along F, stored ``[E, H, F]`` (the down GEMM);
    - ``gate_up_t``: ``w_gate_up`` along 2F, stored ``[E, H, 2F]`` (dx = dh Wguᵀ), or None;
    - ``down_t``: ``w_down`` along H, stored ``[E, F, H]`` (g = dy Wdᵀ), or None.

    ``"bf16"`` (mxfp8 through the BF16 GEMMs, :mod:`jax_mok.quantization.cuda`): the same four
    quantizations dequantized exactly, bf16 arrays in the weights' logical layouts
    (``[E, H, 2F]``, ``[E, F, H]``).

    ``recipe``, ``dtype`` (the dtype the weights had when quantized: the layer quantizes them
    in x's dtype, so a call checks that they match) and ``form`` are static metadata. Without the
    two backward layouts (``fp8_weights(..., backward=False)``) the layer runs forward only.
    """

    gate_up: QuantizedWeight | jax.Array
    down: QuantizedWeight | jax.Array
    gate_up_t: QuantizedWeight | jax.Array | None
    down_t: QuantizedWeight | jax.Array | None
    recipe: str = dataclasses.field(metadata=dict(static=True))
    dtype: str = dataclasses.field(metadata=dict(static=True))
    form: str = dataclasses.field(default="fp8", metadata=dict(static=True))

    @property
    def backward(self) -> bool:
        """Whether the layouts the backward reads are held (differentiable use)."""
        return self.gate_up_t is not None and self.down_t is not None

    def require_backward(self) -> None:
        """Raises TypeError unless the backward's layouts are held (a differentiated call)."""
        if not self.backward:
            raise TypeError("jax_mok: fp8_weights made with backward=False hold the forward "
                            "layouts only; make them with jax_mok.fp8_weights(params) to "
                            "differentiate")

    def nbytes(self) -> int:
        """Device bytes of every layout (values and scales)."""
        leaves = jax.tree_util.tree_leaves(self)
        return sum(int(a.size) * a.dtype.itemsize for a in leaves)


def mx_bf16_weights(w_gate_up: jax.Array, w_down: jax.Array, backward: bool = True) -> Fp8Weights:
    """The ``form="bf16"`` layouts of mxfp8 through the BF16 GEMMs (:mod:`jax_mok.quantization
    .cuda`), made by the CUDA qdq pass: deq(Q(w)) in the weights' dtype and logical layouts —
    ``gate_up`` along H, ``down`` along F (the forward), ``gate_up_t`` along 2F, ``down_t`` along
    H (the data gradients; None without ``backward``). :func:`fp8_weights` returns these where
    the layer runs that path."""
    w_gate_up, w_down = (jax.lax.stop_gradient(w) for w in (w_gate_up, w_down))
    back = ((targets.mx_qdq(w_gate_up, 2), targets.mx_qdq(w_down, 2)) if backward
            else (None, None))
    return Fp8Weights(targets.mx_qdq(w_gate_up, 1), targets.mx_qdq(w_down, 1), *back, "mxfp8",
                      jnp.dtype(w_gate_up.dtype).name, "bf16")


def quantizer_on_cuda(implementation: str | None, hidden: int, ffn: int, experts: int,
                      caller: str) -> bool:
    """Whether ``caller`` (a public function's name, for its errors) quantizes expert weights
    with the CUDA kernel: ``implementation`` None picks it on a GPU backend within the kernels'
    limits, ``"cuda"`` requires it, ``"reference"`` refuses it."""
    if implementation not in (None, "cuda", "reference"):
        raise ValueError(f"jax_mok.{caller}: implementation must be None, 'cuda' or "
                         f"'reference', got {implementation!r}")
    if implementation == "reference":
        return False
    on_gpu = implementation == "cuda" or jax.default_backend() == "gpu"
    reason = cuda.cuda_limits(hidden, ffn, experts)
    if implementation == "cuda" and reason is not None:
        raise ValueError(f"jax_mok.{caller}: implementation='cuda' but {reason}")
    return on_gpu and reason is None


def quantize_expert_weight(w: jax.Array, recipe: str, backward: bool, use_cuda: bool):
    """``(along axis 1, along axis 2 or None)`` QuantizedWeights of ``w [E, A, B]``."""
    if use_cuda:
        if backward:
            (av, as_), (bv, bs) = targets.quantize_weight_both(w, recipe)
            return QuantizedWeight(av, as_, recipe, 1), QuantizedWeight(bv, bs, recipe, 2)
        av, as_ = targets.quantize_weight(w, recipe, 1)
        return QuantizedWeight(av, as_, recipe, 1), None
    fwd = QuantizedWeight.quantize(w, recipe, 1)
    return fwd, QuantizedWeight.quantize(w, recipe, 2) if backward else None


def fp8_weights(params, *, dtype=None, backward: bool = True,
                implementation: str | None = None) -> Fp8Weights:
    """Every FP8 layout of ``params``' expert weights that the layer reads, for
    ``params.config.quantization``, made once and passed to ``jax_mok.moe(x, params,
    fp8_weights=...)`` (or the Flax modules' ``fp8_weights`` argument) as often as wanted. Where
    the CUDA layer runs mxfp8 through the BF16 GEMMs (bf16, unquantized weight gradients) these
    are the bf16 dequantized layouts it reads (``form="bf16"``: twice the bytes of the FP8 ones).

    Args:
      params: :class:`jax_mok.MoEParams` with ``config.quantization`` set and array expert
        weights (not :func:`jax_mok.quantize_params`'s inference layout).
      dtype: the dtype the layer will see the weights in, i.e. the activations' dtype (the
        layer casts the weights to x's dtype before quantizing them). None: the weights' own
        dtype. With float32 master weights and bfloat16 activations pass ``jnp.bfloat16``.
      backward: also the two layouts the backward reads (training). False: the forward's only
        (half the memory; the call then refuses to be differentiated).
      implementation: None (the CUDA quantizer where the FP8 kernels run, else the JAX one),
        ``"cuda"`` or ``"reference"``: which quantizer; both give the same bits.

    Returns:
      :class:`Fp8Weights`; no gradient flows through it (the weights enter through
      ``jax.lax.stop_gradient``): the layer's gradients reach ``params`` directly.
    """
    recipe = params.config.quantization
    if recipe is None:
        raise ValueError("jax_mok.fp8_weights: params.config.quantization is None; set "
                         "MoEConfig(quantization='fp8_block' or 'mxfp8')")
    check_recipe(recipe, "params.config.quantization")
    for name in ("w_gate_up", "w_down"):
        w = getattr(params, name)
        if isinstance(w, QuantizedWeight):
            raise TypeError(f"jax_mok.fp8_weights: params.{name} is already quantized "
                            "(jax_mok.quantize_params); pass the array weights")
    dtype = jnp.dtype(params.w_gate_up.dtype if dtype is None else dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"jax_mok.fp8_weights: dtype must be a float dtype, got {dtype}")
    config = params.config
    use_cuda = quantizer_on_cuda(implementation, config.hidden_size, config.ffn_size,
                                 config.num_experts, "fp8_weights")
    w_gu = jax.lax.stop_gradient(params.w_gate_up).astype(dtype)
    w_dn = jax.lax.stop_gradient(params.w_down).astype(dtype)
    if use_cuda and recipe == "mxfp8" and cuda.mx_bf16_limits(
            dtype, config.weight_gradient_mode()) is None:
        # The layer will run mxfp8 through the BF16 GEMMs: the layouts those read.
        return mx_bf16_weights(w_gu, w_dn, backward)
    gate_up, gate_up_t = quantize_expert_weight(w_gu, recipe, backward, use_cuda)
    down, down_t = quantize_expert_weight(w_dn, recipe, backward, use_cuda)
    return Fp8Weights(gate_up, down, gate_up_t, down_t, recipe, dtype.name)


def quantize_params(params, recipe: str, *, dtype=None, implementation: str | None = None):
    """``params`` with its routed expert weights pre-quantized for inference and decode.

    Returns a :class:`jax_mok.MoEParams` whose ``w_gate_up`` is a :class:`QuantizedWeight` along
    H (stored ``[E, 2F, H]``) and ``w_down`` one along F (stored ``[E, H, F]``), the forward
    layout of the FP8 layer, and whose config has ``quantization=recipe``. Router and shared
    weights are unchanged. ``dtype``: cast the weights to it before quantizing; ``jax_mok.moe``
    casts array weights to x's dtype before quantizing them, so pass x's dtype (or store the
    params in it) for bitwise the same forward. Gradients through the result are refused.
    ``implementation``: which quantizer, as in :func:`jax_mok.fp8_weights` — None (the CUDA
    weight quantizer where the FP8 kernels run: one pass per weight, no transposed copy of it in
    XLA; else the JAX one), ``"cuda"`` or ``"reference"``; both give the same bits.
    """
    if not isinstance(params, MoEParams):
        raise TypeError(f"quantize_params: params must be a jax_mok.MoEParams, got "
                        f"{type(params).__name__}")
    check_recipe(recipe)
    config = params.config
    if config.quantization not in (None, recipe):
        raise ValueError(f"quantize_params: recipe={recipe!r} but params.config.quantization="
                         f"{config.quantization!r}; they must agree")
    use_cuda = quantizer_on_cuda(
        implementation, config.hidden_size, config.ffn_size, config.num_experts,
        "quantize_params")
    weights = {}
    for name in ("w_gate_up", "w_down"):
        w = getattr(params, name)
        if isinstance(w, QuantizedWeight):
            raise ValueError(f"quantize_params: params.{name} is already a QuantizedWeight")
        weights[name], _ = quantize_expert_weight(
            w if dtype is None else w.astype(dtype), recipe, False, use_cuda)
    return dataclasses.replace(params, **weights,
                               config=dataclasses.replace(config, quantization=recipe))


def check_fp8_weights(prepared, config, x_dtype) -> None:
    """Raises TypeError / ValueError unless ``prepared`` (an :class:`Fp8Weights`) suits a call
    with ``config`` on x of ``x_dtype``."""
    if not isinstance(prepared, Fp8Weights):
        raise TypeError("jax_mok.moe: fp8_weights must be the result of jax_mok.fp8_weights, got "
                        f"{type(prepared).__name__}")
    if config.quantization is None:
        raise ValueError("jax_mok.moe: fp8_weights given but params.config.quantization is None")
    if prepared.recipe != config.quantization:
        raise ValueError(f"jax_mok.moe: fp8_weights hold recipe {prepared.recipe!r} but "
                         f"params.config.quantization={config.quantization!r}")
    if jnp.dtype(prepared.dtype) != jnp.dtype(x_dtype):
        raise ValueError(f"jax_mok.moe: fp8_weights were quantized from {prepared.dtype} weights "
                         f"but x is {jnp.dtype(x_dtype).name}; the layer quantizes the weights in "
                         f"x's dtype: make them with jax_mok.fp8_weights(params, "
                         f"dtype=jnp.{jnp.dtype(x_dtype).name})")
    E, H, F = config.num_experts, config.hidden_size, config.ffn_size
    want = {"gate_up": (E, H, 2 * F), "down": (E, F, H)}
    for name, shape in want.items():
        got = getattr(prepared, name).shape
        if tuple(got) != shape:
            raise ValueError(f"jax_mok.moe: fp8_weights.{name} has logical shape {tuple(got)}, "
                             f"but params.config needs {shape}")


__all__ = ["Fp8Weights", "check_fp8_weights", "fp8_weights", "mx_bf16_weights",
           "quantize_expert_weight", "quantize_params", "quantizer_on_cuda"]
