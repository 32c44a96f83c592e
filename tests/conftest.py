"""Shared pytest setup.

GPU tests are marked ``gpu`` (``multigpu`` for >= 2 GPUs). Without a GPU they are skipped, unless
``JAX_MOK_REQUIRE_CUDA=1`` (set by tools/gpu_check.sh on the GPU machine), which turns every such
skip into a failure so a broken GPU setup cannot pass silently.
"""

from __future__ import annotations

import jax
import pytest

from jax_mok import tuning

jax.config.update("jax_enable_x64", False)


def _gpu_count() -> int:
    try:
        return len(jax.devices("gpu"))
    except RuntimeError:
        return 0


def pytest_runtest_setup(item):
    need = 2 if "multigpu" in item.keywords else 1 if "gpu" in item.keywords else 0
    if not need:
        return
    gpus = _gpu_count()
    if gpus < need:
        reason = f"needs {need} CUDA GPU(s), found {gpus}"
        if tuning.read("JAX_MOK_REQUIRE_CUDA"):
            pytest.fail(f"JAX_MOK_REQUIRE_CUDA=1 but the test {reason}")
        pytest.skip(reason)
