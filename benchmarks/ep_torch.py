"""B5 (expert parallel): PyTorch with NCCL ``all_to_all_single`` dispatch/combine + the B3 compute.

The peer of jax_mok's expert-parallel layer (B4) in ../shared/BENCHMARKS.md: what a PyTorch user
writes today for an MoE layer whose experts are split over the GPUs of one host.

    python3 -m benchmarks.ep_torch --out OUT/ep_torch.jsonl [--shapes S1,S2]
        [--tokens 4096,8192,16384] [--expert-scale 1] [--reps 10] [--budget-s 300]
    # the same logic on the CPU (gloo, 2 processes, tiny shapes): a debug run, not a benchmark
    python3 -m benchmarks.ep_torch --out /tmp/ep_torch.jsonl --backend gloo --device cpu \\
        --shapes S1,S6 --tokens 64,96 --scale-model 0.03125 --expert-scale 4 --reps 3

The script spawns one process per visible CUDA GPU itself (``--nproc`` to use fewer; 2 on the
CPU), with MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, and ``init_process_group("nccl")``.
NVLink multicast is forbidden on our machines: NCCL_NVLS_ENABLE is forced to "0" (not defaulted)
before any process group exists. JAX (used only to draw the routing with the harness's own
``testing.random_routing``) is forced onto the CPU so that it takes no GPU memory.

Per shape (H, F, E, k from ``jax_mok.testing.SHAPES``; ``E // --expert-scale`` experts in all,
rounded down to a multiple of the process count, ``E / ep`` per rank) × tokens per GPU × routing
(balanced: softmax top-k of random normal logits; skewed: the harness's calibrated bias on the
first 10 % of experts, ``benchmarks.problems.calibrate_skew``, so ~50 % of the assignments go to
10 % of the experts, which all live on rank 0), in bf16, rank 0 writes one JSON line with:

- ``fwd_ms``: the layer forward from given ids / weights: sort the (token, expert) assignments by
  expert (hence by destination rank), count them per expert, exchange the counts with
  ``all_to_all_single`` (one host sync for the split sizes), gather one row per assignment and
  send the rows with ``all_to_all_single`` (input / output split sizes), the local experts'
  compute = B3 (``benchmarks.peers_torch.routed_experts`` over the received rows with k = 1 and
  unit weights: its gather groups the rows by local expert, ``torch._grouped_mm`` gate/up, SwiGLU,
  ``torch._grouped_mm`` down, and its float32 ``index_add_`` puts the results back in received
  order), the reverse ``all_to_all_single``, and the weighted float32 ``index_add_`` combine on
  the home rank.
- ``fwd_bwd_ms``: the same under autograd, gradients of sum(y * dy) (dy a fixed random
  cotangent, passed as ``grad_outputs``) w.r.t. x, the routing weights and the local expert
  weights. The exchanges are differentiable through ``torch.distributed.nn.functional.
  all_to_all_single`` (or, with ``--a2a-autograd own`` or where that is missing, a small
  ``autograd.Function`` whose backward is the reverse exchange).
- ``comm_ms``: the two row exchanges (dispatch + combine) alone, same split sizes;
  ``compute_ms``: the local B3 compute alone on the received rows; ``overlap`` = fwd_ms /
  max(comm_ms, compute_ms) (B5 runs them one after the other, so >= 1).
- ``bytes_per_direction``: bytes one GPU sends to the other GPUs over both exchanges (rows to
  other ranks × H × 2 bytes, dispatch + combine; the busiest GPU, mean over the input sets), and
  ``comm_GBps`` = that / comm_ms.
- ``check_rel_err``: relative Frobenius error of the EP forward against a float32 single-rank
  computation on rank 0 of the first ``--check-tokens`` (256) tokens of every rank (their x, ids,
  weights gathered to rank 0, every expert's weights streamed to it in chunks), bound
  ``--check-tol`` (2e-2). ``check_grad_rel_err`` does the same for dx, d_topk_weights and the
  expert weight gradients, from one EP forward+backward whose cotangent is zero outside the
  checked tokens (so the weight gradients are those tokens' sums, which rank 0 recomputes).
  ``check_passed``: every one of these errors within the bound. The check runs before the timings
  and does not stop them.

Timings are the median of ``--reps`` iterations after ``--warmup`` (3), each preceded by a
``dist.barrier`` and device synchronization and closed by one (perf_counter), rotating over two
token-side input sets (x, ids, weights, dy) so that the L2 cannot hold them; the expert weights
(0.6-11 GB per GPU for S1/S2) exist once. Every time reported is the slowest rank's median
(``ms_per_rank`` has each rank's). A failure (out of memory, ...) on any rank is recorded as the
config's ``error``; the workers are then restarted for the configs left. Configs left after
``--budget-s`` are recorded as ``skipped``. Exit code 2: torch, CUDA, NCCL, ``torch._grouped_mm``
or a second GPU missing.

Known differences: the receiver's un-permute is B3's float32 ``index_add_`` with unit weights
(exact, but heavier than the bf16 ``index_copy_`` a hand-tuned EP layer might use); it is inside
``compute_ms`` and ``fwd_ms``. tools/ep_bench.py (B4, peer) reaches the same hot share by
scaling the hot experts' router columns (softmax routing has no bias term), calibrated the same
way; the records carry ``hot_share`` so that the skewed rows can be matched.
torch 2.14 deprecates ``torch.distributed.nn.functional.all_to_all_single`` (the warning is
silenced; it still works).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import queue as queue_module
import socket
import sys
import time
import traceback
import warnings
import zlib

import numpy as np

ROUTINGS = ("balanced", "skewed")


def _force_env() -> None:
    """Before anything imports jax or creates a process group (parent and every worker)."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast is forbidden on our machines
    os.environ["JAX_PLATFORMS"] = "cpu"  # JAX only draws the routing here: no GPU memory for it


def _list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 -m benchmarks.ep_torch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="JSON-lines file (appended)")
    p.add_argument("--shapes", default="S1,S2", help="names from jax_mok.testing.SHAPES")
    p.add_argument("--tokens", default="4096,8192,16384", help="tokens per GPU")
    p.add_argument("--routing", default="balanced,skewed", help="balanced and/or skewed")
    p.add_argument(
        "--expert-scale",
        type=int,
        default=1,
        help="divide E by this (S2's 256 experts are 22.5 GB in bf16)",
    )
    p.add_argument("--reps", type=int, default=10, help="timed iterations (median)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first")
    p.add_argument(
        "--budget-s",
        type=float,
        default=300.0,
        help="configs not started after this many seconds are recorded as skipped",
    )
    p.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    p.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cpu (with --backend gloo): a debug run of the logic, not a benchmark",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="processes (default: every visible GPU; 2 on the CPU)",
    )
    p.add_argument(
        "--scale-model",
        type=float,
        default=1.0,
        help="multiply H and F by this (rounded to multiples of 8): CPU debug runs",
    )
    p.add_argument("--scale-tokens", type=float, default=1.0, help="multiply --tokens by this")
    p.add_argument(
        "--check-tokens",
        type=int,
        default=256,
        help="tokens per rank in the correctness check (0: no check)",
    )
    p.add_argument(
        "--check-tol",
        type=float,
        default=2e-2,
        help="bound on the relative Frobenius errors of the check",
    )
    p.add_argument(
        "--a2a-autograd",
        default="auto",
        choices=("auto", "torch", "own"),
        help="differentiable exchange: torch.distributed.nn.functional or our own",
    )
    p.add_argument(
        "--debug-loop",
        action="store_true",
        help="CPU only: per-expert matmul loop instead of torch._grouped_mm",
    )
    p.add_argument(
        "--stall-s",
        type=float,
        default=240.0,
        help="kill the workers when they report nothing for this long",
    )
    p.add_argument("--fail-at", default=None, help=argparse.SUPPRESS)  # "rank:config" (tests)
    args = p.parse_args(argv)
    args.shapes, args.routing = _list(args.shapes), _list(args.routing)
    args.tokens = [max(1, int(round(int(t) * args.scale_tokens))) for t in _list(args.tokens)]
    from jax_mok.testing import SHAPES  # light: jax on the CPU, nothing allocated

    bad = [s for s in args.shapes if s not in SHAPES]
    if bad or not args.shapes:
        p.error(f"--shapes: expected a comma list from {sorted(SHAPES)}, got {args.shapes}")
    if not args.routing or any(r not in ROUTINGS for r in args.routing):
        p.error(f"--routing: expected a comma list from {list(ROUTINGS)}, got {args.routing}")
    if args.reps < 1 or args.warmup < 0 or args.expert_scale < 1 or not args.tokens:
        p.error("--reps >= 1, --warmup >= 0, --expert-scale >= 1 and --tokens are required")
    if (args.device == "cpu") != (args.backend == "gloo"):
        p.error("use --device cuda with --backend nccl, or --device cpu with --backend gloo")
    if args.debug_loop and args.device != "cpu":
        p.error("--debug-loop is a CPU debug path; the GPU always runs torch._grouped_mm")
    return args


def _say(line: str) -> None:
    """One write per line: the parent and rank 0 share stdout."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _fail(message: str) -> None:
    print(f"ep_torch: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def _preflight(args: argparse.Namespace) -> int:
    """The process count, or exit 2 with a message when torch / CUDA / NCCL / GPUs are missing."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        _fail(f"torch is not installed ({e}); B5 needs torch with CUDA and NCCL")
    if not dist.is_available():
        _fail(f"torch {torch.__version__} was built without torch.distributed")
    if args.device == "cpu":
        if not dist.is_gloo_available():
            _fail(f"torch {torch.__version__} has no gloo backend")
        world = args.nproc or 2
    else:
        if not torch.cuda.is_available():
            _fail(
                f"torch {torch.__version__} sees no CUDA device (--device cpu --backend gloo "
                "runs the logic on the CPU)"
            )
        if not dist.is_nccl_available():
            _fail(f"torch {torch.__version__} has no NCCL backend")
        if not hasattr(torch, "_grouped_mm"):
            _fail(f"torch {torch.__version__} has no torch._grouped_mm (B3's compute)")
        visible = torch.cuda.device_count()
        world = args.nproc or visible
        if world > visible:
            _fail(f"--nproc {world} but only {visible} GPU(s) are visible")
    if world < 2:
        _fail(f"expert parallelism needs at least 2 processes / GPUs, got {world}")
    return world


# ----------------------------------------------------------------------------------------------
# Configs and records (the parent and rank 0 both build them).


@dataclasses.dataclass(frozen=True)
class Config:
    index: int
    shape: str
    tokens: int
    routing: str


def _configs(args: argparse.Namespace) -> list[Config]:
    out = []  # token-major: the first token count covers every shape before the budget ends
    for tokens in args.tokens:
        for shape in args.shapes:
            for routing in args.routing:
                out.append(Config(len(out), shape, tokens, routing))
    return out


def _shape(args, name: str):
    from benchmarks.problems import scaled_shape

    return scaled_shape(name, 1.0, args.scale_model)


def _experts(args, name: str, world: int) -> int:
    """Experts in all: E // expert_scale, at least one per rank, a multiple of the ranks."""
    from jax_mok.testing import SHAPES

    return max(world, SHAPES[name].experts // args.expert_scale) // world * world


def _base_record(args, cfg: Config, world: int, torch_version: str | None) -> dict:
    from jax_mok.testing import SHAPES

    shape = _shape(args, cfg.shape)
    experts = _experts(args, cfg.shape, world)
    return {
        "impl": "B5",
        "shape": cfg.shape,
        "experts": experts,
        "scaled": experts != SHAPES[cfg.shape].experts or args.scale_model != 1.0,
        "tokens_per_gpu": cfg.tokens,
        "ep": world,
        "routing": cfg.routing,
        "hidden": shape.hidden,
        "ffn": shape.ffn,
        "top_k": shape.top_k,
        "experts_per_rank": experts // world,
        "backend": args.backend,
        "torch": torch_version,
    }


def _seed(*parts) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode())


# ----------------------------------------------------------------------------------------------
# The layer (torch is imported inside the functions: the parent can print --help without it).


@dataclasses.dataclass
class Plan:
    """One rank's exchange plan for one set of ids (computed inside the timed forward)."""

    order: object  # [T*k] assignments sorted by global expert, hence by destination rank
    token: object  # [T*k] home token of each sorted assignment
    send_splits: list[int]  # rows to each rank
    recv_splits: list[int]  # rows from each rank
    local_ids: object  # [R] local expert of each received row (source-major, expert-minor)


def make_plan(ids, experts: int, world: int) -> Plan:
    """Sort by expert, count per expert, exchange the counts (one host sync for the splits)."""
    import torch
    import torch.distributed as dist

    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)  # [world * E_local], grouped by owner rank
    recv_counts = torch.empty_like(counts)  # [world * E_local]: my experts' counts per source
    dist.all_to_all_single(recv_counts, counts)
    splits = torch.stack((counts.view(world, -1).sum(1), recv_counts.view(world, -1).sum(1)))
    send_splits, recv_splits = splits.tolist()
    e_local = experts // world
    expert_of_block = torch.arange(e_local, device=ids.device).repeat(world)
    local_ids = torch.repeat_interleave(expert_of_block, recv_counts, output_size=sum(recv_splits))
    return Plan(order, order // k, send_splits, recv_splits, local_ids)


def exchange_plain(rows, out_splits: list[int], in_splits: list[int]):
    """``all_to_all_single`` of ``rows [N, H]`` (not differentiable)."""
    import torch.distributed as dist

    out = rows.new_empty((sum(out_splits), rows.shape[1]))
    dist.all_to_all_single(out, rows, out_splits, in_splits)
    return out


def exchange_torch_nn(rows, out_splits: list[int], in_splits: list[int]):
    """The differentiable ``torch.distributed.nn.functional.all_to_all_single``."""
    import torch.distributed.nn.functional as dist_nn

    out = rows.new_empty((sum(out_splits), rows.shape[1]))
    return dist_nn.all_to_all_single(out, rows.contiguous(), out_splits, in_splits)


def _own_exchange_function():
    import torch
    import torch.distributed as dist

    class Exchange(torch.autograd.Function):
        """``all_to_all_single`` whose backward is the reverse exchange of the gradient."""

        @staticmethod
        def forward(ctx, rows, out_splits, in_splits):
            ctx.splits = (out_splits, in_splits)
            out = rows.new_empty((sum(out_splits), rows.shape[1]))
            dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits)
            return out

        @staticmethod
        def backward(ctx, grad):
            out_splits, in_splits = ctx.splits
            back = grad.new_empty((sum(in_splits), grad.shape[1]))
            dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
            return back, None, None

    return Exchange


def exchange_differentiable(kind: str):
    """(callable, label) for ``--a2a-autograd`` auto / torch / own."""
    if kind in ("auto", "torch"):
        try:
            import torch.distributed.nn.functional as dist_nn

            if hasattr(dist_nn, "all_to_all_single"):
                return exchange_torch_nn, "torch.distributed.nn.functional.all_to_all_single"
        except ImportError:
            pass
        if kind == "torch":
            raise RuntimeError("torch.distributed.nn.functional.all_to_all_single is missing")
    fn = _own_exchange_function()
    return (lambda rows, o, i: fn.apply(rows, o, i)), "own autograd.Function (reverse exchange)"


def b3_compute(rows, local_ids, w_gate_up, w_down):
    """The local experts on the received rows: B3's ``routed_experts`` with k = 1, weights 1.

    Its argsort / ``index_select`` groups the rows by local expert, ``torch._grouped_mm`` gate/up,
    SwiGLU, ``torch._grouped_mm`` down, and its float32 ``index_add_`` (weight 1: exact) puts each
    result back at its received position; returned in the rows' dtype.
    """
    import torch

    from benchmarks.peers_torch import routed_experts

    if rows.shape[0] == 0:  # nothing routed here: keep the graph connected to the rows
        return rows * 0
    ones = torch.ones((rows.shape[0], 1), dtype=torch.float32, device=rows.device)
    return routed_experts(rows, local_ids[:, None], ones, w_gate_up, w_down)


def _per_expert_loop(rows, expert, w_gate_up, w_down):
    """One matmul pair per expert: ``(order, out)`` with ``order`` grouping the rows by
    ``expert`` (stable) and ``out[i]`` the SwiGLU expert output of ``rows[order[i]]`` (None when
    no row is routed). Shared by the CPU debug path and the float32 check reference."""
    import torch
    import torch.nn.functional as nnf

    F = w_down.shape[1]
    order = torch.argsort(expert, stable=True)
    pieces, start = [], 0
    for e, count in enumerate(torch.bincount(expert, minlength=w_gate_up.shape[0]).tolist()):
        if count:
            h = rows.index_select(0, order[start : start + count]) @ w_gate_up[e]
            pieces.append((nnf.silu(h[:, :F]) * h[:, F:]) @ w_down[e])
            start += count
    return order, (torch.cat(pieces) if pieces else None)


def debug_loop_compute(rows, local_ids, w_gate_up, w_down):
    """DEBUG PATH, CPU only (never on the GPU): one matmul pair per local expert, for torch builds
    whose ``torch._grouped_mm`` cannot run on the CPU. Same math as ``b3_compute``."""
    import torch

    if rows.device.type != "cpu":
        raise RuntimeError("debug_loop_compute is a CPU debug path")
    order, out = _per_expert_loop(rows, local_ids, w_gate_up, w_down)
    if out is None:
        return rows * 0
    back = torch.zeros(rows.shape, dtype=torch.float32, device=rows.device)
    return back.index_add(0, order, out.float()).to(rows.dtype)


def ep_layer(x, topk_weights, w_gate_up, w_down, plan: Plan, exchange, compute):
    """``y [T, H]`` of this rank's tokens: dispatch, local experts, combine (see the docstring)."""
    import torch

    rows = x.index_select(0, plan.token)  # one row per assignment, grouped by destination
    received = exchange(rows, plan.recv_splits, plan.send_splits)
    out = compute(received, plan.local_ids, w_gate_up, w_down)
    back = exchange(out, plan.send_splits, plan.recv_splits)  # same order as ``rows``
    w = topk_weights.reshape(-1).index_select(0, plan.order)
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    y.index_add_(0, plan.token, back.float() * w[:, None])
    return y.to(x.dtype)


# ----------------------------------------------------------------------------------------------
# The float32 single-rank reference of the check (on rank 0).


class Reference:
    """Float32 outputs and gradients of the gathered check tokens, one chunk of experts at a
    time (a chunk's weights arrive, its contributions and weight gradients are computed, the
    chunk is dropped), so rank 0 never holds every expert at once."""

    def __init__(self, x, ids, topk_weights, dy):
        import torch

        self.x = x.float().requires_grad_(True)
        self.tw = topk_weights.float().requires_grad_(True)
        self.ids, self.dy = ids, dy.float()
        self.y = torch.zeros(self.x.shape, dtype=torch.float32, device=x.device)
        self.sq = {"d_w_gate_up": [0.0, 0.0], "d_w_down": [0.0, 0.0]}  # [|got-ref|^2, |ref|^2]

    def add(self, first: int, w_gate_up, w_down, d_w_gate_up, d_w_down) -> None:
        """Experts ``first .. first + len(w_gate_up) - 1`` (global ids) with the EP gradients."""
        import torch

        gu = w_gate_up.float().requires_grad_(True)
        dn = w_down.float().requires_grad_(True)
        n = gu.shape[0]
        tok, slot = ((self.ids >= first) & (self.ids < first + n)).nonzero(as_tuple=True)
        if tok.numel():
            order, out = _per_expert_loop(self.x[tok], self.ids[tok, slot] - first, gu, dn)
            tok, slot = tok[order], slot[order]
            contrib = out * self.tw[tok, slot][:, None]
            y = torch.zeros_like(self.y).index_add(0, tok, contrib)
            self.y += y.detach()
            (y * self.dy).sum().backward()
        pairs = (("d_w_gate_up", d_w_gate_up, gu), ("d_w_down", d_w_down, dn))
        for name, got, leaf in pairs:
            ref = torch.zeros_like(leaf) if leaf.grad is None else leaf.grad
            self.sq[name][0] += float(((got.double() - ref.double()) ** 2).sum())
            self.sq[name][1] += float((ref.double() ** 2).sum())

    def errors(self, y, dx, d_topk_weights) -> dict[str, float]:
        import torch

        def rel(got, want):
            want = torch.zeros_like(got, dtype=torch.float32) if want is None else want
            num = torch.linalg.vector_norm(got.double() - want.double())
            den = torch.linalg.vector_norm(want.double())
            return float(num / den) if float(den) > 0 else float(num)

        out = {
            "y": rel(y, self.y),
            "dx": rel(dx, self.x.grad),
            "d_topk_weights": rel(d_topk_weights, self.tw.grad),
        }
        for name, (num, den) in self.sq.items():
            out[name] = math.sqrt(num / den) if den > 0 else math.sqrt(num)
        return out


# ----------------------------------------------------------------------------------------------
# One rank.


@dataclasses.dataclass
class TokenSet:
    x: object  # [T, H] bf16
    ids: object  # [T, k] int64 global expert ids
    tw: object  # [T, k] float32 routing weights
    dy: object  # [T, H] bf16 cotangent


class Rank:
    def __init__(self, rank: int, world: int, args: argparse.Namespace, t0: float, queue):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank, self.world, self.args, self.t0, self.queue = rank, world, args, t0, queue
        self.cuda = args.device == "cuda"
        if self.cuda:
            torch.cuda.set_device(rank)
            self.dev = torch.device("cuda", rank)
            torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference stays float32
        else:
            self.dev = torch.device("cpu")
            torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
        torch.set_float32_matmul_precision("highest")
        timeout = datetime.timedelta(seconds=max(60.0, 2 * args.stall_s))
        kwargs = {"device_id": self.dev} if self.cuda else {}
        try:
            dist.init_process_group(
                args.backend, rank=rank, world_size=world, timeout=timeout, **kwargs
            )
        except TypeError:  # a torch without device_id
            dist.init_process_group(args.backend, rank=rank, world_size=world, timeout=timeout)
        self.exchange_diff, self.a2a_label = exchange_differentiable(args.a2a_autograd)
        self.compute, self.compute_label = self._pick_compute()

    def _pick_compute(self):
        if self.cuda:
            return b3_compute, "B3 peers_torch.routed_experts (torch._grouped_mm)"
        if not self.args.debug_loop:
            try:  # does torch._grouped_mm run on this CPU build?
                t = self.torch
                rows = t.randn((6, 16), dtype=t.bfloat16)
                b3_compute(
                    rows,
                    t.tensor([0, 1, 0, 1, 1, 0]),
                    t.randn((2, 16, 16)).bfloat16(),
                    t.randn((2, 8, 16)).bfloat16(),
                )
                return b3_compute, "B3 peers_torch.routed_experts (torch._grouped_mm, CPU)"
            except Exception as e:  # noqa: BLE001 - any failure sends the CPU to the loop
                self.log(f"torch._grouped_mm fails on the CPU ({type(e).__name__}): debug loop")
        return debug_loop_compute, "DEBUG per-expert matmul loop (CPU only)"

    # -- helpers ---------------------------------------------------------------------------
    def log(self, text: str) -> None:
        if self.rank == 0:
            _say(f"[{time.time() - self.t0:7.1f}s] {text}")
            self.queue.put(("alive",))

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def barrier(self) -> None:
        if self.cuda:
            self.dist.barrier(device_ids=[self.dev.index])
        else:
            self.dist.barrier()

    def agree(self, flag: bool) -> bool:
        """Rank 0's ``flag`` on every rank."""
        t = self.torch.tensor([int(flag)], dtype=self.torch.int32, device=self.dev)
        self.dist.broadcast(t, 0)
        return bool(t.item())

    def gather_floats(self, values: list[float]) -> list[list[float]]:
        t = self.torch.tensor(values, dtype=self.torch.float64, device=self.dev)
        out = [self.torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(out, t)
        return [o.tolist() for o in out]

    def gather_cat(self, t):
        """``t`` of every rank concatenated along dim 0 (same shape on every rank)."""
        t = t.contiguous()
        out = [self.torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(out, t)
        return self.torch.cat(out)

    def time_ms(self, fn, num_sets: int) -> tuple[float, list[float]]:
        """Slowest rank's median ms of ``fn(set_index)``, and every rank's median."""
        for i in range(self.args.warmup):
            fn(i % num_sets)
        self.sync()
        times = []
        for i in range(self.args.reps):
            self.barrier()
            self.sync()
            start = time.perf_counter()
            fn(i % num_sets)
            self.sync()
            times.append(time.perf_counter() - start)
        median = 1e3 * float(np.median(times))
        per_rank = [v[0] for v in self.gather_floats([median])]
        return max(per_rank), per_rank

    def free(self) -> None:
        if self.cuda:
            self.torch.cuda.empty_cache()

    # -- inputs ----------------------------------------------------------------------------
    def make_weights(self, shape, experts: int):
        """This rank's ``(w_gate_up [E_l, H, 2F], w_down [E_l, F, H])`` bf16, normal / sqrt(fan_in),
        one expert at a time from a per-expert seed (independent of the process count)."""
        torch = self.torch
        e_local, H, F = experts // self.world, shape.hidden, shape.ffn
        gu = torch.empty((e_local, H, 2 * F), dtype=torch.bfloat16, device=self.dev)
        dn = torch.empty((e_local, F, H), dtype=torch.bfloat16, device=self.dev)
        gen = torch.Generator(device=self.dev)
        for j in range(e_local):
            gen.manual_seed(_seed("weights", shape.name, self.rank * e_local + j))
            gu[j] = torch.randn((H, 2 * F), generator=gen, device=self.dev) / math.sqrt(H)
            dn[j] = torch.randn((F, H), generator=gen, device=self.dev) / math.sqrt(F)
        return gu, dn

    def make_set(self, shape, experts: int, tokens: int, skew: float, i: int, route) -> TokenSet:
        import jax

        torch = self.torch
        seed = _seed("tokens", shape.name, tokens, self.rank, i)  # same for both routings
        gen = torch.Generator(device=self.dev)
        gen.manual_seed(seed)
        x = torch.randn((tokens, shape.hidden), generator=gen, device=self.dev)
        dy = torch.randn((tokens, shape.hidden), generator=gen, device=self.dev)
        ids, tw = route(jax.random.key(seed), tokens, experts, shape.top_k, skew)
        ids = torch.from_numpy(np.array(ids, dtype=np.int64)).to(self.dev)
        tw = torch.from_numpy(np.array(tw, dtype=np.float32)).to(self.dev)
        return TokenSet(x.to(torch.bfloat16), ids, tw, dy.to(torch.bfloat16))

    # -- passes ----------------------------------------------------------------------------
    def forward(self, s: TokenSet, weights, experts: int):
        with self.torch.no_grad():
            plan = make_plan(s.ids, experts, self.world)
            return ep_layer(s.x, s.tw, *weights, plan, exchange_plain, self.compute)

    def forward_backward(self, s: TokenSet, weights, experts: int, dy=None):
        """``(y, (dx, d_topk_weights, d_w_gate_up, d_w_down))``: autograd of sum(y * dy)."""
        torch = self.torch
        with torch.no_grad():
            plan = make_plan(s.ids, experts, self.world)
        leaves = [t.detach().requires_grad_(True) for t in (s.x, s.tw, *weights)]
        y = ep_layer(*leaves, plan, self.exchange_diff, self.compute)
        grads = torch.autograd.grad(
            y, leaves, grad_outputs=s.dy if dy is None else dy, allow_unused=True
        )
        pairs = zip(grads, leaves, strict=True)
        grads = tuple(torch.zeros_like(v) if g is None else g for g, v in pairs)
        return y.detach(), grads

    def check(self, s: TokenSet, weights, experts: int, ffn: int) -> dict:
        """EP forward / backward of set 0 against the float32 single-rank reference on rank 0."""
        torch, dist = self.torch, self.dist
        n = min(self.args.check_tokens, s.x.shape[0])
        dy = s.dy.clone()
        dy[n:] = 0  # the weight gradients become the checked tokens' sums
        y, (dx, dtw, dgu, ddn) = self.forward_backward(s, weights, experts, dy)
        got = [self.gather_cat(t[:n]) for t in (y, dx, dtw)]
        inputs = [self.gather_cat(t[:n]) for t in (s.x, s.ids, s.tw, dy)]
        del y, dx, dtw
        ref = Reference(*inputs) if self.rank == 0 else None
        e_local = experts // self.world
        # bytes per expert on rank 0: bf16 weights + grads, float32 copies + grads (12 bytes an
        # element of the 3·H·F), twice that for the temporaries; chunks of about 2 GiB
        per_expert = 3 * s.x.shape[1] * ffn * 12 * 2
        chunk = max(1, min(e_local, (2 << 30) // per_expert))
        for r in range(self.world):
            for c0 in range(0, e_local, chunk):
                c1 = min(e_local, c0 + chunk)
                local = [t[c0:c1].contiguous() for t in (*weights, dgu, ddn)]
                if self.rank == 0 and r == 0:
                    ref.add(c0, *local)
                elif self.rank == r:
                    for t in local:
                        dist.send(t, dst=0)
                elif self.rank == 0:
                    remote = [torch.empty_like(t) for t in local]
                    for t in remote:
                        dist.recv(t, src=r)
                    ref.add(r * e_local + c0, *remote)
                del local
        del dgu, ddn
        if ref is None:
            return {}
        errors = ref.errors(*got)
        worst = max(errors.values())
        return {
            "check_rel_err": errors["y"],
            "check_grad_rel_err": {k: v for k, v in errors.items() if k != "y"},
            "check_passed": bool(math.isfinite(worst) and worst <= self.args.check_tol),
            "check_tol": self.args.check_tol,
            "check_tokens": n * self.world,
        }

    # -- one config ------------------------------------------------------------------------
    def run_config(self, cfg: Config, weights, route, label: str) -> dict:
        from benchmarks.problems import HOT_FRACTION, calibrate_skew

        torch, args = self.torch, self.args
        shape = _shape(args, cfg.shape)
        experts = _experts(args, cfg.shape, self.world)
        if shape.top_k > experts:
            raise ValueError(f"top_k {shape.top_k} > {experts} experts (lower --expert-scale)")
        H = shape.hidden
        rec: dict = {}
        skew = calibrate_skew(experts, shape.top_k) if cfg.routing == "skewed" else 0.0
        sets = [self.make_set(shape, experts, cfg.tokens, skew, i, route) for i in range(2)]
        plans = [make_plan(s.ids, experts, self.world) for s in sets]
        hot = max(1, int(experts * HOT_FRACTION))
        local = []
        for p in plans:
            off_rank = (
                sum(p.send_splits)
                - p.send_splits[self.rank]
                + sum(p.recv_splits)
                - p.recv_splits[self.rank]
            )
            local += [float(off_rank * H * 2), float(sum(p.recv_splits))]
        local.append(float((sets[0].ids < hot).float().mean()))
        stats = self.gather_floats(local)
        sent = [float(np.mean(v[0:4:2])) for v in stats]  # bytes sent off-GPU, mean over sets
        rec.update(
            {
                "skew": skew,
                "hot_share": float(np.mean([v[4] for v in stats])),
                "rows_received_per_rank": [int(v[1]) for v in stats],
                "bytes_per_rank": sent,
                "bytes_per_direction": max(sent),
                "a2a_autograd": self.a2a_label,
                "compute_path": self.compute_label,
            }
        )
        if self.rank == 0 and args.fail_at == f"0:{cfg.index}":
            raise RuntimeError(f"--fail-at {args.fail_at}: injected failure")
        if self.rank == 1 and args.fail_at == f"1:{cfg.index}":
            raise RuntimeError(f"--fail-at {args.fail_at}: injected failure")

        if args.check_tokens > 0:
            rec.update(self.check(sets[0], weights, experts, shape.ffn))
            self.free()
            if self.rank == 0:
                g = rec["check_grad_rel_err"]
                self.log(
                    f"{label}: check y {rec['check_rel_err']:.2e}, dx {g['dx']:.2e}, "
                    f"dw {g['d_topk_weights']:.2e}, dWgu {g['d_w_gate_up']:.2e}, "
                    f"dWd {g['d_w_down']:.2e} -> "
                    f"{'ok' if rec['check_passed'] else 'FAILED'}"
                )

        per_rank = {}
        rec["fwd_ms"], per_rank["fwd"] = self.time_ms(
            lambda i: self.forward(sets[i], weights, experts), len(sets)
        )
        self.log(f"{label}: fwd {rec['fwd_ms']:.3f} ms")
        rec["fwd_bwd_ms"], per_rank["fwd_bwd"] = self.time_ms(
            lambda i: self.forward_backward(sets[i], weights, experts), len(sets)
        )
        self.free()
        self.log(f"{label}: fwd+bwd {rec['fwd_bwd_ms']:.3f} ms")

        # communication alone: the same two exchanges on buffers of the same sizes
        buf = {"send": [s.x.index_select(0, p.token) for s, p in zip(sets, plans, strict=True)]}
        buf["recv"] = [
            torch.empty((sum(p.recv_splits), H), dtype=torch.bfloat16, device=self.dev)
            for p in plans
        ]
        buf["back"] = [torch.empty_like(t) for t in buf["send"]]

        def comm(i: int) -> None:
            p = plans[i]
            self.dist.all_to_all_single(
                buf["recv"][i], buf["send"][i], p.recv_splits, p.send_splits
            )
            self.dist.all_to_all_single(
                buf["back"][i], buf["recv"][i], p.send_splits, p.recv_splits
            )

        rec["comm_ms"], per_rank["comm"] = self.time_ms(comm, len(sets))
        del buf["send"], buf["back"]
        # compute alone: the local experts on the received rows (buf["recv"] holds them now)
        with torch.no_grad():
            rec["compute_ms"], per_rank["compute"] = self.time_ms(
                lambda i: self.compute(buf["recv"][i], plans[i].local_ids, *weights), len(sets)
            )
        buf.clear()
        self.free()
        flops = shape.config().routed_flops(cfg.tokens)
        rec.update(
            {
                "comm_GBps": rec["bytes_per_direction"] / (rec["comm_ms"] * 1e-3) / 1e9,
                "overlap": rec["fwd_ms"] / max(rec["comm_ms"], rec["compute_ms"]),
                "fwd_tflops_per_gpu": flops / (rec["fwd_ms"] * 1e-3) / 1e12,
                "fwd_bwd_tflops_per_gpu": 3 * flops / (rec["fwd_bwd_ms"] * 1e-3) / 1e12,
                "ms_per_rank": per_rank,
                "reps": args.reps,
                "warmup": args.warmup,
            }
        )
        self.log(
            f"{label}: comm {rec['comm_ms']:.3f} ms ({rec['comm_GBps']:.1f} GB/s), "
            f"compute {rec['compute_ms']:.3f} ms, overlap {rec['overlap']:.2f}"
        )
        return rec


def _worker(
    rank: int,
    world: int,
    port: int,
    args: argparse.Namespace,
    todo: list[Config],
    queue,
    t0: float,
    machine: dict,
) -> None:
    """One process: init the group, run ``todo`` in order; any exception ends the process."""
    _force_env()
    # torch 2.14 deprecates torch.distributed.nn.functional.all_to_all_single (it still works)
    warnings.filterwarnings(
        "ignore", message=".*all_to_all_single is deprecated", category=FutureWarning
    )
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    current = None
    try:
        import jax

        from jax_mok import testing

        route = jax.jit(testing.random_routing, static_argnums=(1, 2, 3))
        st = Rank(rank, world, args, t0, queue)
        torch = st.torch
        extra = dict(machine)
        if rank == 0 and st.cuda:
            extra["device"] = torch.cuda.get_device_name(st.dev)
            try:
                extra["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
            except Exception:  # noqa: BLE001 - informational only
                pass
        cache: dict = {}
        for cfg in todo:
            current = cfg.index
            base = _base_record(args, cfg, world, torch.__version__) | extra
            label = f"{cfg.shape} T={cfg.tokens} {cfg.routing} ep={world}"
            if st.agree(time.time() - t0 > args.budget_s):
                if rank == 0:
                    queue.put(
                        (
                            "record",
                            cfg.index,
                            base
                            | {"skipped": f"--budget-s {args.budget_s:g} spent before this config"},
                        )
                    )
                continue
            if cfg.shape not in cache:
                cache.clear()
                st.free()
                st.log(
                    f"{cfg.shape}: generating {_experts(args, cfg.shape, world)} experts' weights"
                )
                cache[cfg.shape] = st.make_weights(
                    _shape(args, cfg.shape), _experts(args, cfg.shape, world)
                )
            st.log(f"{label}: start")
            rec = st.run_config(cfg, cache[cfg.shape], route, label)
            if rank == 0:
                queue.put(("record", cfg.index, base | rec))
        if rank == 0:
            queue.put(("done",))
        st.dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which records it
        traceback.print_exc()
        queue.put(("fatal", rank, current, f"rank {rank}: {type(e).__name__}: {e}"[:1500]))
        queue.close()
        queue.join_thread()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)  # other ranks may be inside a collective: the parent ends them
    queue.close()
    queue.join_thread()


# ----------------------------------------------------------------------------------------------
# The parent: spawns the workers, writes the records, restarts after a failure.


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _emit(sink, records: dict, index: int, rec: dict) -> None:
    """Keeps, appends (flushed) and prints one config's record."""
    records[index] = rec
    sink.write(json.dumps(rec) + "\n")
    sink.flush()
    _say(json.dumps(rec))


def _run_workers(
    args, world: int, todo: list[Config], t0: float, machine: dict, sink, records: dict
) -> tuple[str | None, bool]:
    """Runs ``todo`` once; returns (failure text or None, whether the failure was at start-up)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_worker, args=(r, world, port, args, todo, queue, t0, machine), daemon=True
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    failures: list[str] = []  # in arrival order: the first is the cause, the rest its echoes
    at_startup: list[bool] = []
    failed_at, last, stalled = None, time.time(), None

    def handle(msg) -> None:
        if msg[0] == "record":
            _, index, rec = msg
            _emit(sink, records, index, rec)
        elif msg[0] == "fatal":
            failures.append(msg[3])
            at_startup.append(msg[2] is None)

    while True:
        try:
            msg = queue.get(timeout=1.0)
            last = time.time()
            handle(msg)
            continue
        except queue_module.Empty:
            pass
        codes = [p.exitcode for p in procs]
        if all(c is not None for c in codes):
            break
        bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if (failures or bad) and failed_at is None:
            failed_at = time.time()
        if failed_at is not None and time.time() - failed_at > 10.0:
            break  # the others hang in a collective: end them below
        if time.time() - last > args.stall_s:
            stalled = f"no progress for {args.stall_s:g} s: workers ended"
            break
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(timeout=30)
    while True:  # what was sent before the end
        try:
            handle(queue.get(timeout=0.2))
        except queue_module.Empty:
            break
    codes = [p.exitcode for p in procs]
    if stalled:
        failures.append(stalled)
    if not failures and any(c != 0 for c in codes):
        failures.append(f"worker exit codes {codes}")
    if not failures:
        return None, False
    return " | ".join(failures)[:3000], bool(at_startup) and all(at_startup)


def main(argv: list[str] | None = None) -> int:
    _force_env()
    args = parse_args(argv)
    world = _preflight(args)
    import torch

    t0 = time.time()
    configs = _configs(args)
    from benchmarks.run import git_commit

    machine = {"commit": git_commit(), "device_kind": args.device}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    _say(
        f"[{0.0:7.1f}s] B5: torch {torch.__version__}, {args.backend} on {world} "
        f"{'GPUs' if args.device == 'cuda' else 'CPU processes'}, {len(configs)} configs, "
        f"budget {args.budget_s:g} s, NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}"
    )
    records: dict[int, dict] = {}
    todo, rc = list(configs), 0
    with open(args.out, "a") as sink:

        def write(cfg: Config, extra: dict) -> None:
            rec = _base_record(args, cfg, world, torch.__version__) | machine | extra
            _emit(sink, records, cfg.index, rec)

        while todo:
            failure, startup = _run_workers(args, world, todo, t0, machine, sink, records)
            todo = [c for c in todo if c.index not in records]
            if failure is None or not todo:
                break
            if startup:  # nothing would run: record it for every config left
                for cfg in todo:
                    write(cfg, {"error": f"workers failed at start-up: {failure}"})
                rc = 1
                break
            write(todo[0], {"error": failure})
            _say(
                f"[{time.time() - t0:7.1f}s] config {todo[0].index} failed ({failure}); "
                f"{len(todo) - 1} configs left"
            )
            todo = todo[1:]
            if time.time() - t0 > args.budget_s:
                for cfg in todo:
                    write(cfg, {"skipped": f"--budget-s {args.budget_s:g} spent"})
                break
        for cfg in configs:  # a run that ended without recording a config says so
            if cfg.index not in records:
                write(cfg, {"error": "not run (the workers ended before it)"})
                rc = 1
    _say(f"[{time.time() - t0:7.1f}s] B5 done: {len(configs)} records appended to {args.out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
