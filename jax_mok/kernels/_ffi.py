"""Loads the native extensions and registers their XLA FFI targets, once."""

from __future__ import annotations

import functools
import importlib

import jax

TARGETS = ("mok_moe_fwd", "mok_moe_bwd")  # every backend
CUDA_ONLY_TARGETS = ("mok_moe_fwd_train", "mok_moe_bwd_saved",  # saved activations
                     "mok_moe_fwd_fp8", "mok_moe_fwd_train_fp8", "mok_moe_bwd_fp8",
                     "mok_moe_bwd_saved_fp8", "mok_quantize", "mok_quantize_weight",
                     "mok_quantize_weight_both")  # the FP8 layer


@functools.cache
def _load(module_name: str, platform: str):
    """Imports ``module_name`` and registers its targets for ``platform`` (None when it is not
    built)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    for name, capsule in module.registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform=platform)
    return module


def cpu_module():
    """The CPU extension, registered for platform "cpu" (None when it is not built)."""
    return _load("jax_mok._mok_cpu", "cpu")


def cuda_module():
    """The CUDA extension, registered for platform "CUDA" (None when it is not built)."""
    return _load("jax_mok._mok_cuda", "CUDA")


def kernels_built(platform: str) -> bool:
    """Whether the kernels for ``platform`` ("cpu", or "gpu" / "cuda") are built (and, by this
    call, registered with XLA)."""
    if platform == "cpu":
        return cpu_module() is not None
    if platform in ("gpu", "cuda"):
        return cuda_module() is not None
    return False


def register_targets() -> None:
    """Registers the targets of every platform this process can lower for: the CPU kernels, and
    the CUDA ones where a GPU is present (``implementation="ffi"`` lets XLA pick per platform)."""
    kernels_built("cpu")
    if gpu_present():
        kernels_built("cuda")


def gpu_present() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def backends() -> dict:
    """What is built and usable here, for `python -m jax_mok info` and error messages."""
    return {
        "cpu_kernels": kernels_built("cpu"),
        "cuda_kernels": kernels_built("cuda"),
        "gpu_present": gpu_present(),
    }
