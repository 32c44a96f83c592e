"""FP8 quantization of the MoE layer (``MoEConfig(quantization="mxfp8" | "fp8_block")``), all of
it in this package. Submodules, bottom-up, with the layer of the architecture each sits at
(docs/architecture.md):

- :mod:`~jax_mok.quantization.format`: the formats' rules (its docstring is the specification)
  and their element-level pieces, exact on every platform; bottom layer, beside ``params``.
- :mod:`~jax_mok.quantization.blocks`: the public quantizers over whole arrays,
  :class:`QuantizedWeight`, :func:`check_weights`, :func:`cast_weight`; bottom layer (``params``
  and ``reference`` import them).
- :mod:`~jax_mok.quantization.layer`: the FP8 layer in pure JAX, a ``custom_vjp``: the
  semantics, the CPU path and the oracle of the CUDA kernels; the ``reference`` layer.
- :mod:`~jax_mok.quantization.cuda`: the FP8 layer on the CUDA kernels (a ``custom_vjp`` over
  the FFI targets) and the choice of implementation; the ``kernels`` layer.
- :mod:`~jax_mok.quantization.weights`: :func:`~jax_mok.quantization.weights.fp8_weights`, the
  expert weights' FP8 layouts made once per optimizer step (``jax_mok.moe(...,
  fp8_weights=...)``); the ``kernels`` layer (it calls the CUDA quantizer).
- :mod:`~jax_mok.quantization.rows`: FP8 token rows over the expert-parallel XLA transport; the
  ``ep`` layer (``ep.transport`` imports it).

This module re-exports the public API of ``format`` and ``blocks`` only: ``params`` and
``reference`` import it, so it must not import ``layer``, ``cuda``, ``weights`` or ``rows``
(which import ``kernels``, which imports ``reference``); import those submodules by name
(``jax_mok.fp8_weights`` is re-exported by the package ``jax_mok``).
"""

from jax_mok.quantization.blocks import (
    QuantizedWeight,
    cast_weight,
    check_weights,
    dequantize,
    dequantize_fp8_block,
    dequantize_mxfp8,
    fake_quantize,
    quantize,
    quantize_fp8_block,
    quantize_mxfp8,
)
from jax_mok.quantization.format import BLOCK, E4M3_MAX, MX_BLOCK, RECIPES, check_recipe

__all__ = [
    "BLOCK",
    "cast_weight",
    "check_recipe",
    "check_weights",
    "E4M3_MAX",
    "MX_BLOCK",
    "RECIPES",
    "QuantizedWeight",
    "dequantize",
    "dequantize_fp8_block",
    "dequantize_mxfp8",
    "fake_quantize",
    "quantize",
    "quantize_fp8_block",
    "quantize_mxfp8",
]
