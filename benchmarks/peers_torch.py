"""B3: the MoE layer composed in PyTorch, as a PyTorch user writes it today.

Gather the routed rows, ``torch._grouped_mm`` (gate/up), SwiGLU, ``torch._grouped_mm`` (down),
weighted ``index_add_`` combine in float32; backward by autograd. torch is imported lazily: the
harness runs without it, and records why B3 did not run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from benchmarks.problems import Probe, Problem
from jax_mok import tuning


def unavailable_reason(platform: str) -> str | None:
    """None when B3 can run next to JAX on ``platform`` ("gpu" / "cpu"), else why not.

    On the CPU B3 runs only with ``JAX_MOK_BENCH_TORCH_CPU=1`` (to test its math; its timings
    there mean little).
    """
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    if platform == "gpu":
        if not torch.cuda.is_available():
            return "torch has no CUDA device"
        return None
    if tuning.read("JAX_MOK_BENCH_TORCH_CPU"):
        return None
    return "no CUDA (set JAX_MOK_BENCH_TORCH_CPU=1 to run B3 on the CPU anyway)"


def group_by_expert(ids, num_experts: int):
    """``(order, offsets, token)`` of ``ids [T, k]``: the flat assignments grouped by expert
    (stable), each expert's group end (int32, as the grouped GEMMs want) and each grouped row's
    token."""
    import torch

    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    return order, offsets, order // ids.shape[1]


def combine(out, topk_weights, order, token, like):
    """``y`` (``like``'s shape and dtype): the grouped rows ``out [T*k, H]`` weighted by their
    routing weights and added per token in float32 (``index_add_``)."""
    import torch

    w = topk_weights.reshape(-1).index_select(0, order)
    y = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
    y.index_add_(0, token, out.float() * w[:, None])
    return y.to(like.dtype)


def routed_experts(x, ids, topk_weights, w_gate_up, w_down):
    """``y [T, H]`` (x's dtype) from ``x [T, H]``, ``ids [T, k] int64``, ``topk_weights [T, k]
    float32``, ``w_gate_up [E, H, 2F]``, ``w_down [E, F, H]`` (torch tensors, one device)."""
    import torch
    import torch.nn.functional as nnf

    F = w_gate_up.shape[2] // 2
    order, offsets, token = group_by_expert(ids, w_gate_up.shape[0])
    rows = x.index_select(0, token)  # [T*k, H]
    h = torch._grouped_mm(rows, w_gate_up, offs=offsets)  # [T*k, 2F]
    a = nnf.silu(h[:, :F]) * h[:, F:]
    out = torch._grouped_mm(a, w_down, offs=offsets)  # [T*k, H]
    return combine(out, topk_weights, order, token, x)


class TorchRunner:
    """B3 on one Problem: torch views (DLPack, no copy) of each input set, forward or fwd+bwd.

    ``fn``: the routed-experts function with :func:`routed_experts`' signature (B3-fp8 passes
    its own)."""

    def __init__(self, problem: Problem, passname: str, fn: Callable = routed_experts):
        import torch

        self.torch = torch
        self.passname = passname
        self.fn = fn
        self.cuda = problem.sets[0].x.devices().pop().platform == "gpu"
        view = torch.from_dlpack
        self.sets = []
        for s in problem.sets:
            self.sets.append((
                view(s.x), view(s.ids).long(), view(s.weights), view(s.w_gate_up),
                view(s.w_down), view(s.dy),
            ))

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def run(self, i: int, dy=None):
        """Runs set ``i``; returns ``y`` or ``(y, (dx, d_w, d_w_gate_up, d_w_down))``."""
        torch = self.torch
        x, ids, tw, gu, dn, set_dy = self.sets[i % len(self.sets)]
        if self.passname == "fwd":
            with torch.no_grad():
                return self.fn(x, ids, tw, gu, dn)
        leaves = [t.detach().requires_grad_(True) for t in (x, tw, gu, dn)]
        y = self.fn(leaves[0], ids, leaves[1], leaves[2], leaves[3])
        grads = torch.autograd.grad(y, leaves, grad_outputs=set_dy if dy is None else dy)
        return y.detach(), grads

    def step(self) -> Callable[[int], None]:
        def step(i: int) -> None:
            out = self.run(i)
            self._sync()
            del out

        return step

    def check_outputs(self, probe: Probe) -> dict[str, np.ndarray]:
        """The probed pieces of the check run (set 0, cotangent zero outside the probe)."""
        torch = self.torch
        dy = torch.from_dlpack(probe.dy_check) if self.passname == "fwdbwd" else None
        out = self.run(0, dy)
        self._sync()
        dev = self.sets[0][0].device
        tok = torch.as_tensor(probe.tokens, device=dev)

        def host(t):
            return t.detach().float().cpu().numpy()

        if self.passname == "fwd":
            return {"y": host(out.index_select(0, tok))}
        y, (dx, dtw, dgu, dd) = out
        ex = torch.as_tensor(probe.experts, device=dev)
        hr = torch.as_tensor(probe.h_rows, device=dev)
        fr = torch.as_tensor(probe.f_rows, device=dev)
        return {
            "y": host(y.index_select(0, tok)),
            "dx": host(dx.index_select(0, tok)),
            "d_topk_weights": host(dtw.index_select(0, tok)),
            "d_w_gate_up": host(dgu.index_select(0, ex).index_select(1, hr)),
            "d_w_down": host(dd.index_select(0, ex).index_select(1, fr)),
        }

    def release(self) -> None:
        self.sets = []
        if self.cuda:
            self.torch.cuda.empty_cache()


def torch_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001 - not installed, or metadata missing
        return None


def is_oom(error: BaseException) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(error, torch.OutOfMemoryError)
