"""B6: Liger-Kernel's Triton fused MoE, ``liger_kernel.ops.fused_moe.LigerFusedMoEFunction``.

``LigerFusedMoEFunction.apply(x [T, H], gate_up_proj [E, 2F, H], down_proj [E, H, F],
top_k_index [T, k] int32, top_k_weights [T, k] float) -> y [T, H]`` (gate = the first F rows of
``gate_up_proj``, as jax_mok's first F columns), a ``torch.autograd.Function`` whose backward
returns dx, both weight gradients and the routing-weight gradient (in dy's dtype). Its inputs
must be contiguous: the harness stores each expert weight once more in Liger's layout, outside
the timed call (a model using Liger keeps its weights that way).

Autotuning. Its GEMM kernels autotune over 32 Triton configs each (16 for the weight-gradient
kernels, 40 for the token gather), keyed by (H, F): minutes per shape. ``--b6-autotune``:
  - ``pinned`` (default): ``LIGER_FUSED_MOE_AUTOTUNE=0``, Liger's own switch that pins every
    kernel to one config (BLOCK_N 128, BLOCK_K 64, 8 warps, 2 stages for the GEMMs), no search;
  - ``full``: Liger's autotune runs during the first call of each shape (the untimed check call,
    whose duration is recorded as ``first_call_s``); give it ``--item-timeout-s`` to match.
The switch is read when liger_kernel is imported, so the worker sets it before its import.

Where liger_kernel is not importable, :func:`ensure_importable` installs a carried wheel
(``.whl/liger_kernel-*.whl``) into a private folder the way ``tools/gpu_check.sh`` does.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

from benchmarks.peers_torch import TorchRunner
from benchmarks.problems import Problem

AUTOTUNE_MODES = {"pinned": "0", "full": "1"}
ENV = "LIGER_FUSED_MOE_AUTOTUNE"


def ensure_importable(repo_root: str, target: str) -> str | None:
    """Makes liger_kernel importable: already installed, or installed from ``.whl/`` into
    ``target`` (added to sys.path). Returns the folder to put on PYTHONPATH for the workers, or
    None when nothing was installed (already importable, or no wheel: the workers then record
    why B6 did not run)."""
    import importlib.util

    if importlib.util.find_spec("liger_kernel") is not None:
        return None
    wheels = sorted(glob.glob(os.path.join(repo_root, ".whl", "liger_kernel-*.whl")))
    if not wheels:
        return None
    os.makedirs(target, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--target", target, wheels[-1]]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        print(f"B6: could not install {wheels[-1]}: {result.stderr[-300:]}", flush=True)
        return None
    sys.path.insert(0, target)
    return target


def unavailable_reason(platform: str, autotune: str) -> str | None:
    """None when B6 can run here, else why not. Sets Liger's autotune switch (module docstring)
    before the first import; an explicit ``LIGER_FUSED_MOE_AUTOTUNE`` in the environment wins."""
    if autotune not in AUTOTUNE_MODES:
        raise ValueError(f"b6 autotune must be one of {list(AUTOTUNE_MODES)}, got {autotune!r}")
    if platform != "gpu":
        return "Liger-Kernel's fused MoE runs Triton kernels on CUDA only"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch has no CUDA device"
    os.environ.setdefault(ENV, AUTOTUNE_MODES[autotune])
    try:
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure means B6 cannot run
        return (f"liger_kernel.ops.fused_moe is not importable ({type(error).__name__}: "
                f"{str(error)[:200]}); carry the wheel: pip download --no-deps -d .whl "
                "liger-kernel")
    return None


def autotune_setting() -> str:
    """What Liger's autotune does in this process, for the record."""
    value = os.environ.get(ENV, "1")
    if value.lower() in ("0", "false", "no"):
        return f"{ENV}={value}: one pinned config per kernel, no search"
    return f"{ENV}={value}: Triton autotune inside the first (untimed) call of each shape"


def liger_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("liger-kernel")
    except Exception:  # noqa: BLE001 - not installed, or metadata missing
        return None


class LigerRunner(TorchRunner):
    """B6 on one Problem, with :class:`TorchRunner`'s sets, timing step and probe slicing.

    ``fn(x, ids, tw, gate_up_proj, down_proj)`` defaults to ``LigerFusedMoEFunction.apply`` with
    its argument order; tests pass a stand-in with the same layout contract. Weight gradients
    come back in jax_mok's layout as transposed views (no copy)."""

    def __init__(self, problem: Problem, passname: str, fn=None):
        import torch

        if fn is None:
            from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

            def fn(x, ids, tw, gate_up_proj, down_proj):
                return LigerFusedMoEFunction.apply(x, gate_up_proj, down_proj, ids, tw)

        super().__init__(problem, passname, fn)
        layouts: dict[int, tuple] = {}  # one Liger copy per distinct weight array
        sets = []
        for s, (x, _, tw, gu, dn, dy) in zip(problem.sets, self.sets, strict=True):
            key = id(s.w_gate_up)
            if key not in layouts:
                layouts[key] = (gu.transpose(1, 2).contiguous(), dn.transpose(1, 2).contiguous())
            ids = torch.from_dlpack(s.ids).to(torch.int32)
            sets.append((x, ids, tw, *layouts[key], dy))
        self.sets = sets

    def run(self, i: int, dy=None):
        """:meth:`TorchRunner.run` on Liger's sets, with the weight gradients returned as
        ``[E, H, 2F]`` / ``[E, F, H]`` views of Liger's ``[E, 2F, H]`` / ``[E, H, F]``."""
        out = super().run(i, dy)
        if self.passname == "fwd":
            return out
        y, (dx, dtw, dgu, ddn) = out
        return y, (dx, dtw, dgu.transpose(1, 2), ddn.transpose(1, 2))
