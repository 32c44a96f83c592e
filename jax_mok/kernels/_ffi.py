"""Loads the native extensions and registers their XLA FFI targets, once; says whether this
process's GPU runs the CUDA kernels (:func:`cuda_device_limits`)."""

from __future__ import annotations

import functools
import importlib

import jax

TARGETS = ("mok_moe_fwd", "mok_moe_bwd")  # every backend
CUDA_ONLY_TARGETS = ("mok_moe_fwd_train", "mok_moe_bwd_saved",  # saved activations
                     "mok_moe_fwd_fp8", "mok_moe_fwd_train_fp8", "mok_moe_bwd_fp8",
                     "mok_moe_bwd_saved_fp8", "mok_quantize", "mok_quantize_weight",
                     "mok_quantize_weight_both")  # the FP8 layer
CUDA_ARCH = "sm_90a"  # the one target of the CUDA kernels (ffi/CMakeLists.txt)
CUDA_MAJOR = 9  # the compute capabilities they run on: 9.x (ffi/cuda/host/device.cc checks too)


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


@functools.cache
def gpu_capability() -> str | None:
    """The compute capability of this process's first GPU (``jax.devices("gpu")[0]``), e.g.
    ``"9.0"``; None without a GPU. Read once per process."""
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        return None
    if not gpus:
        return None
    return str(getattr(gpus[0], "compute_capability", "unknown"))


def cuda_device_limits() -> str | None:
    """None where the CUDA kernels can run on this process's GPU (compute capability 9.x), or
    where there is no GPU (nothing to run them on: lowering for CUDA without one is allowed);
    else the reason, naming the capability. Decided at trace time, so that the default picks the
    reference instead of a call that fails at run time."""
    capability = gpu_capability()
    if capability is None or capability.split(".")[0] == str(CUDA_MAJOR):
        return None
    return (f"this GPU has compute capability {capability} and the jax_mok CUDA kernels are "
            f"built for {CUDA_ARCH} (compute capability {CUDA_MAJOR}.x) only")


def backends() -> dict:
    """What is built and usable here, for `python -m jax_mok info` and error messages."""
    return {
        "cpu_kernels": kernels_built("cpu"),
        "cuda_kernels": kernels_built("cuda"),
        "gpu_present": gpu_present(),
        "gpu_capability": gpu_capability(),
        "cuda_device_limits": cuda_device_limits(),
    }
