"""The harness's only reach below jax_mok's public API, kept in one place so that it can be
re-pointed when modules move.

The protocol times the routed experts given the routing (``topk_ids``, ``topk_weights``), as the
torch peers are given it; the public ``jax_mok.moe`` also runs the router. So the harness calls
the routed-experts functions under ``jax_mok.moe`` directly: the BF16 custom_vjp
(``autodiff.routed_experts``) and the FP8 layer (``routed_experts_fp8``), and asks the FFI
loader whether the kernels are built. Every package layout so far is recognised: the kernel
modules at the top of ``jax_mok`` or under ``jax_mok/kernels/``, the FP8 layer on the kernels in
``jax_mok.quantization.cuda`` or, before that package, in the kernel modules' ``fp8``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from collections.abc import Callable


def _module(name: str):
    """``jax_mok.kernels.<name>`` where that package exists, else ``jax_mok.<name>``."""
    if importlib.util.find_spec("jax_mok.kernels") is not None:
        candidate = f"jax_mok.kernels.{name}"
        if importlib.util.find_spec(candidate) is not None:
            return importlib.import_module(candidate)
    return importlib.import_module(f"jax_mok.{name}")


def _fp8_module():
    """``jax_mok.quantization.cuda`` where that package exists, else :func:`_module` ``("fp8")``."""
    try:
        return importlib.import_module("jax_mok.quantization.cuda")
    except ModuleNotFoundError as error:
        if error.name != "jax_mok.quantization.cuda":
            raise
    return _module("fp8")


def kernels_built(platform: str) -> bool:
    """Whether jax_mok's FFI kernels are built for ``platform`` ("cpu" or "gpu")."""
    ffi = _module("_ffi")
    module = ffi.cuda_module() if platform == "gpu" else ffi.cpu_module()
    return module is not None


def routed_experts_bf16(implementation: str) -> Callable:
    """``(x [T, H], ids [T, k] int32, topk_weights [T, k] f32, w_gate_up [E, H, 2F],
    w_down [E, F, H]) -> y [T, H]``: the unquantized layer's custom_vjp with ``implementation``
    ("ffi": the kernels; "reference": sort + ``ragged_dot``)."""
    autodiff = _module("autodiff")
    return functools.partial(autodiff.routed_experts, implementation=implementation)


def routed_experts_fp8(recipe: str, implementation: str = "ffi",
                       weight_grads: str | None = None) -> Callable:
    """The FP8 layer for ``recipe`` ("mxfp8" / "fp8_block") with the signature of
    :func:`routed_experts_bf16`. The weights may be arrays (quantized inside the layer) or
    ``jax_mok.QuantizedWeight`` s from ``jax_mok.quantize_params`` (forward only); ``prepared``:
    their FP8 layouts from ``jax_mok.fp8_weights`` (read instead of quantizing).
    ``weight_grads``: ``MoEConfig.fp8_weight_gradients`` (None: the layer's default on one
    device, as ``jax_mok.moe`` resolves it)."""
    from jax_mok.config import weight_gradient_mode

    fp8 = _fp8_module()  # the kernels where they run the call, else the pure-JAX layer
    weight_grads = weight_gradient_mode(weight_grads)

    def call(x2d, topk_ids, topk_weights, w_gate_up, w_down, prepared=None):
        extra = {} if prepared is None else {"prepared": prepared}  # jax_mok.fp8_weights'
        return fp8.routed_experts_fp8(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe,
                                      implementation=implementation, weight_grads=weight_grads,
                                      **extra)

    return call


# A custom call's target as StableHLO (``stablehlo.custom_call @name(``, or the generic
# ``call_target_name = "name"``) or HLO (``custom_call_target="name"``) text prints it.
_FP8_TARGET = re.compile(r'(?:custom_call @|call_target_name\s*=\s*"|custom_call_target=")'
                         r"(mok_\w*fp8\w*)")


def fp8_kernel_targets(lowered_text: str) -> list[str]:
    """The FP8 custom-call targets (``mok_*fp8*``) a lowered program calls: empty when the FP8
    layer lowered to plain XLA operations (its pure-JAX definition)."""
    return sorted(set(_FP8_TARGET.findall(lowered_text)))


def extension_fingerprint() -> str:
    """Which CUDA extension this process runs: the path of the loaded ``_mok_cuda`` module and the
    first 8 hex digits of its file's MD5, or why there is none. An A/B that swaps builds between
    processes prints it in each, so that a run on the wrong build shows in its own log instead of
    passing for an A/B of a build with itself."""
    import hashlib

    ffi = _module("_ffi")
    module = ffi.cuda_module()
    if module is None:
        return "extension: none (the CUDA kernels are not built)"
    path = getattr(module, "__file__", None)
    if path is None:
        return f"extension: {module!r} (no file)"
    with open(path, "rb") as f:
        digest = hashlib.md5(f.read()).hexdigest()[:8]
    return f"extension: {path} md5 {digest}"
