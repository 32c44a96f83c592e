"""B3-fp8: B3 (peers_torch) with its two grouped GEMMs in FP8 through ``torch._scaled_grouped_mm``.

The same gather, SwiGLU and float32 ``index_add_`` combine as B3; the GEMM operands are E4M3 with
float32 row-wise scales: one per row of A (per token for x, per routed row for the SwiGLU
output) and one per output column of each expert's B, ``scale = amax / 448`` over the reduction
axis (1 where a row is all zeros). Everything is quantized inside the timed call, weights
included, as a training step from BF16 master weights does (the jax_mok FP8 rows without
``-pq`` do the same).

``torch._scaled_grouped_mm`` (torch 2.8 to 2.11, CUDA sm_90/sm_100) in the 2d x 3d form takes A
``[M, K]`` row-major, B ``[E, K, N]`` column-major (stored ``[E, N, K]``), ``scale_a [M]`` and
``scale_b [E, N]`` float32, ``offs [E]`` int32 group ends, and returns bf16. Its checks ask for
K and N multiples of 16 and nothing of the group sizes: every group's A rows start at a multiple
of K bytes (16-byte aligned for TMA) and the scales are read by plain loads, so the groups are
not padded (``ROW_ALIGN = 1``; the 16-row alignment torch's FP8 MoE training asks for concerns
its weight-gradient GEMM, whose groups run along K). torch defines no derivative for
``_scaled_grouped_mm``: :func:`fwdbwd_unsupported_reason` finds out on the device at hand.
Without CUDA (``JAX_MOK_BENCH_TORCH_CPU=1``) the GEMM is emulated in float32 on the dequantized
operands, forward only, to test the rest of the math.
"""

from __future__ import annotations

import functools

from benchmarks.peers_torch import combine, group_by_expert

E4M3_MAX = 448.0
ROW_ALIGN = 1  # rows per group need no padding (module docstring)
# The weights are quantized a group of experts at a time so that the float32 temporaries stay
# near this size (S4's w_gate_up is 34 GB in bf16): at most 16 groups on the protocol shapes,
# so the Python loop adds a few dozen launches, not hundreds.
CHUNK_BYTES = 4 << 30


def shape_reason(hidden: int, ffn: int) -> str | None:
    """Why torch._scaled_grouped_mm cannot take this shape (K and N multiples of 16), or None."""
    if hidden % 16 or ffn % 16:
        return (f"torch._scaled_grouped_mm needs K and N multiples of 16; got hidden={hidden}, "
                f"ffn={ffn}")
    return None


def quantize_rows(t):
    """``t [R, C]`` -> ``(values [R, C] e4m3, scales [R] float32)`` along C."""
    import torch

    amax = t.abs().amax(dim=1).float()
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    values = (t.float() / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return values, scale


def quantize_columns(w):
    """``w [E, K, N]`` -> ``(values, scales [E, N] float32)`` along K; ``values`` is the
    ``[E, K, N]`` column-major view of an ``[E, N, K]`` tensor, as the FP8 GEMM reads B."""
    import torch

    E, K, N = w.shape
    values = torch.empty((E, N, K), dtype=torch.float8_e4m3fn, device=w.device)
    scales = torch.empty((E, N), dtype=torch.float32, device=w.device)
    step = max(1, CHUNK_BYTES // (K * N * 4))
    for e0 in range(0, E, step):
        chunk = w[e0:e0 + step]
        amax = chunk.abs().amax(dim=1).float()  # [c, N]
        scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        # a fresh float32 copy (``.float()`` of float32 weights would be the weights themselves)
        q = chunk.to(torch.float32, copy=True).div_(scale[:, None, :]).clamp_(-E4M3_MAX,
                                                                               E4M3_MAX)
        values[e0:e0 + step].copy_(q.transpose(1, 2))  # the cast to E4M3 rounds to nearest
        scales[e0:e0 + step] = scale
    return values.transpose(1, 2), scales


def _emulated_scaled_grouped_mm(a, b, scale_a, scale_b, offs):
    """float32 reference of the 2d x 3d ``torch._scaled_grouped_mm`` (bf16 out), for the CPU."""
    import torch

    a32 = a.float() * scale_a[:, None]
    out = torch.empty((a.shape[0], b.shape[2]), dtype=torch.bfloat16, device=a.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        b32 = b[g].float() * scale_b[g][None, :]
        out[start:end] = (a32[start:end] @ b32).to(torch.bfloat16)
        start = end
    return out


def scaled_grouped_mm(a, b, scale_a, scale_b, offs):
    """``[M, N]`` bf16: per group g, ``(a * scale_a[:, None]) @ (b[g] * scale_b[g])`` over rows
    ``offs[g-1]:offs[g]`` (fast accumulation, as torch's own FP8 MoE training runs it)."""
    import torch

    if a.device.type == "cuda":
        return torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs,
                                        out_dtype=torch.bfloat16, use_fast_accum=True)
    return _emulated_scaled_grouped_mm(a, b, scale_a, scale_b, offs)


def routed_experts(x, ids, topk_weights, w_gate_up, w_down):
    """B3-fp8: ``y [T, H]`` (x's dtype) from ``x [T, H]``, ``ids [T, k] int64``,
    ``topk_weights [T, k] float32``, ``w_gate_up [E, H, 2F]``, ``w_down [E, F, H]``; B3's
    grouping and combine (:mod:`benchmarks.peers_torch`) around the two FP8 GEMMs."""
    import torch.nn.functional as nnf

    F = w_gate_up.shape[2] // 2
    order, offsets, token = group_by_expert(ids, w_gate_up.shape[0])
    x_q, x_scale = quantize_rows(x)  # per token: the same bits as quantizing each routed row
    gu_q, gu_scale = quantize_columns(w_gate_up)
    h = scaled_grouped_mm(x_q.index_select(0, token), gu_q, x_scale.index_select(0, token),
                          gu_scale, offsets)  # [T*k, 2F] bf16
    a = nnf.silu(h[:, :F].float()) * h[:, F:].float()
    a_q, a_scale = quantize_rows(a)
    dn_q, dn_scale = quantize_columns(w_down)
    out = scaled_grouped_mm(a_q, dn_q, a_scale, dn_scale, offsets)  # [T*k, H] bf16
    return combine(out, topk_weights, order, token, x)


@functools.cache
def fwdbwd_unsupported_reason(device_type: str) -> str | None:
    """None when autograd differentiates through ``torch._scaled_grouped_mm`` on this device,
    else why not (a 32 x 32 probe: two groups of 16 rows, one backward)."""
    import torch

    if device_type != "cuda":
        return ("the CPU emulation of torch._scaled_grouped_mm is forward-only (the op itself "
                "needs CUDA sm_90)")
    x = torch.randn(32, 32, device="cuda", requires_grad=True)
    w = torch.randn(2, 32, 32, device="cuda", requires_grad=True)
    try:
        x_q, xs = quantize_rows(x)
        w_q, ws = quantize_columns(w)
        offs = torch.tensor([16, 32], dtype=torch.int32, device="cuda")
        y = scaled_grouped_mm(x_q, w_q, xs, ws, offs)
        torch.autograd.grad(y.float().sum(), (x, w))
    except RuntimeError as error:
        return ("torch autograd cannot differentiate torch._scaled_grouped_mm: "
                f"{str(error).splitlines()[0][:200]}")
    return None
