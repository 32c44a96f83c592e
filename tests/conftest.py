"""Shared pytest setup.

Eight host (CPU) devices, so that the expert-parallel tests can build 2/4/8-device meshes in this
process. It must happen before JAX creates its CPU backend, hence here, at import. It changes only
the CPU platform (``jax.devices("cpu")``); the default device stays device 0, so single-device
tests run as before, and GPUs, when present, are untouched.
"""

from __future__ import annotations

import os

CPU_DEVICES = 8

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", CPU_DEVICES)
    except RuntimeError:  # a backend already exists (e.g. a plugin imported jax and used it)
        pass
