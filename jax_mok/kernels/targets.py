"""Every ``jax.ffi.ffi_call`` of jax_mok: the targets, their operands, results and attributes.

The operand and attribute contract of each target is docs/ffi-contract.md. Tuning reaches the
kernels only here, as attributes built by :func:`attributes` (part of the lowered program, so of
the jit cache key).

Local kernels (``mok_moe_*``, registered for "cpu" and "CUDA"; the ``_train`` / ``_saved`` pair
for "CUDA" only)::

    mok_moe_fwd        (x [T, H], ids [T, k] i32, w [T, k] f32, w_gate_up [E, H, 2F],
                        w_down [E, F, H])                      -> y [T, H]
    mok_moe_fwd_train  (same)                                  -> y, h [T*k, 2F]
    mok_moe_bwd        (dy [T, H], x, ids, w, w_gate_up, w_down) -> dx, dw [T, k], dWgu, dWd
    mok_moe_bwd_saved  (dy, x, ids, w, w_gate_up, w_down, h)   -> dx, dw, dWgu, dWd

Peer transport (``mok_ep_*``, "CUDA" only; ``has_side_effect``: every rank must issue the same
sequence of peer calls, the kernels advance a device-side epoch per call, so XLA must neither
drop nor merge them) and ``mok_home_sum``: see the functions below.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_mok.kernels import vma
from jax_mok.tuning import GEMMS, KernelTuning, PeerTuning, pregather_backward_heuristic

# True: every call carries its tuning attributes, which the extensions' handlers bind
# (docs/ffi-contract.md). An extension built before they existed rejects them with an attribute
# error; False makes attributes() return {} (the tuning then does not reach the kernels) only to
# test the rest of the package against such a build.
_ATTRIBUTES_BOUND = True

KERNEL_TARGETS = ("mok_moe_fwd", "mok_moe_fwd_train", "mok_moe_bwd", "mok_moe_bwd_saved")
STAGED_PEER_TARGETS = ("mok_ep_dispatch", "mok_ep_combine")
FUSED_PEER_TARGETS = ("mok_ep_moe_fwd", "mok_ep_moe_fwd_train", "mok_ep_moe_bwd",
                      "mok_ep_moe_fwd_train_recompute", "mok_ep_moe_bwd_recompute")
# mxfp8 through the BF16 GEMMs ("CUDA" only; jax_mok.quantization.cuda).
MX_TARGETS = ("mok_moe_fwd_mx", "mok_moe_fwd_train_mx", "mok_moe_bwd_saved_mx")
# Their attribute pregather_x is the backward's choice (x and dy copied into expert order).
BACKWARD_TARGETS = ("mok_moe_bwd", "mok_moe_bwd_saved", "mok_ep_moe_bwd",
                    "mok_ep_moe_bwd_recompute", "mok_moe_bwd_saved_mx")


def attributes(target: str, *, kernel: KernelTuning | None = None,
               peer: PeerTuning | None = None, ffn_size: int = 0, assignments: int = 0,
               num_experts: int = 1) -> dict[str, np.generic]:
    """The tuning attributes of one call of ``target``.

    Kernel targets and the fused peer targets: ``pregather_x`` (int32 0 | 1, resolved here from
    the call's shape: ``assignments`` = rows x k over ``num_experts`` experts of width
    ``ffn_size``; for :data:`BACKWARD_TARGETS` the backward's choice, KernelTuning's
    ``pregather_backward``) and ``gemm`` (int32: the index in :data:`jax_mok.tuning.GEMMS`).
    Peer targets: ``copy_engine``, ``sync_check`` (int32 0 | 1), ``timeout_ms`` (int64),
    ``ctas_per_sm`` (int32). ``workspace_id`` and ``phase`` are operands of the call, not
    tuning: the callers add them.
    """
    kernel_side = (target in KERNEL_TARGETS or target in FUSED_PEER_TARGETS
                   or target in MX_TARGETS)
    peer_side = target in STAGED_PEER_TARGETS or target in FUSED_PEER_TARGETS
    if not (kernel_side or peer_side):
        raise ValueError(f"attributes: {target!r} takes no tuning attributes")
    if (kernel_side and kernel is None) or (peer_side and peer is None):
        raise ValueError(f"attributes: {target!r} needs "
                         f"{'KernelTuning ' if kernel_side else ''}"
                         f"{'PeerTuning' if peer_side else ''}")
    if not _ATTRIBUTES_BOUND:
        return {}
    attrs: dict[str, np.generic] = {}
    if kernel_side:
        attrs["pregather_x"] = np.int32(kernel.pregather_for(
            ffn_size, assignments, num_experts, backward=target in BACKWARD_TARGETS))
        attrs["gemm"] = np.int32(GEMMS.index(kernel.gemm))
    if peer_side:
        attrs["copy_engine"] = np.int32(peer.copy == "ce")
        attrs["sync_check"] = np.int32(peer.check == "sync")
        attrs["timeout_ms"] = np.int64(peer.timeout_ms)
        attrs["ctas_per_sm"] = np.int32(peer.ctas_per_sm)
    return attrs


def _local_attributes(target: str, kernel: KernelTuning, x2d, topk_ids, w_gate_up) -> dict:
    return attributes(target, kernel=kernel, ffn_size=w_gate_up.shape[-1] // 2,
                      assignments=x2d.shape[0] * topk_ids.shape[1],
                      num_experts=w_gate_up.shape[0])


def _like(a) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(a.shape, a.dtype)


def _call(target: str, results, *operands, attrs: dict, **options):
    """``jax.ffi.ffi_call`` of ``target`` on ``operands``; inside a ``shard_map`` its results
    are typed as varying over the manual axes of its operands (jax_mok/kernels/vma.py)."""
    out = jax.ffi.ffi_call(target, results, **options)(*operands, **attrs)
    return vma.varying_like(out, *operands)


def _backward_outs(x2d, topk_weights, w_gate_up, w_down):
    return tuple(_like(a) for a in (x2d, topk_weights, w_gate_up, w_down))


def no_vmap_of_gradients(axis_size, in_batched, *args):
    # Per-example weight gradients would need one kernel call per example; say so instead of
    # looping silently.
    raise NotImplementedError(
        "jax_mok: reverse-mode differentiation under jax.vmap is not supported by the kernels. "
        "jax_mok.moe accepts x of any leading shape: fold the vmapped axis into x instead, or "
        "use implementation='reference'"
    )


# ------------------------------------------------------------------ local kernels

@functools.cache
def moe_forward(kernel: KernelTuning):
    """``mok_moe_fwd`` with ``kernel``'s attributes: ``f(x2d, topk_ids, topk_weights, w_gate_up,
    w_down) -> y [T, H]`` in x's dtype. Under ``jax.vmap`` of x (and its routing) the batch is
    folded into the token dimension: one kernel call, no loop."""

    @jax.custom_batching.custom_vmap
    def forward(x2d, topk_ids, topk_weights, w_gate_up, w_down):
        attrs = _local_attributes("mok_moe_fwd", kernel, x2d, topk_ids, w_gate_up)
        return _call("mok_moe_fwd", _like(x2d), x2d, topk_ids, topk_weights, w_gate_up, w_down,
                     attrs=attrs)

    @forward.def_vmap
    def _(axis_size, in_batched, x2d, topk_ids, topk_weights, w_gate_up, w_down):
        if in_batched[3] or in_batched[4]:
            raise NotImplementedError(
                "jax_mok: vmap over the expert weights (w_gate_up / w_down) is not supported; "
                "only x (and its routing) may be batched"
            )

        def fold(a, batched):
            a = a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))
            return a.reshape(-1, *a.shape[2:])

        rows = x2d.shape[-2]
        y = forward(fold(x2d, in_batched[0]), fold(topk_ids, in_batched[1]),
                    fold(topk_weights, in_batched[2]), w_gate_up, w_down)
        return y.reshape(axis_size, rows, -1), True

    return forward


@functools.cache
def moe_forward_train(kernel: KernelTuning):
    """``mok_moe_fwd_train`` (CUDA): ``(y [T, H], h [T*k, 2F])``, h the gate/up
    pre-activations in x's dtype, kept for :func:`moe_backward_saved`."""

    @jax.custom_batching.custom_vmap
    def forward_train(x2d, topk_ids, topk_weights, w_gate_up, w_down):
        tk = topk_ids.shape[0] * topk_ids.shape[1]
        outs = (_like(x2d), jax.ShapeDtypeStruct((tk, w_gate_up.shape[-1]), x2d.dtype))
        attrs = _local_attributes("mok_moe_fwd_train", kernel, x2d, topk_ids, w_gate_up)
        return _call("mok_moe_fwd_train", outs, x2d, topk_ids, topk_weights, w_gate_up, w_down,
                     attrs=attrs)

    forward_train.def_vmap(no_vmap_of_gradients)
    return forward_train


@functools.cache
def moe_backward(kernel: KernelTuning):
    """``mok_moe_bwd``: ``f(dy, x2d, topk_ids, topk_weights, w_gate_up, w_down) -> (dx,
    d_topk_weights, d_w_gate_up, d_w_down)``, recomputing the gate/up GEMM."""

    @jax.custom_batching.custom_vmap
    def backward(dy, x2d, topk_ids, topk_weights, w_gate_up, w_down):
        outs = _backward_outs(x2d, topk_weights, w_gate_up, w_down)
        attrs = _local_attributes("mok_moe_bwd", kernel, x2d, topk_ids, w_gate_up)
        return _call("mok_moe_bwd", outs, dy, x2d, topk_ids, topk_weights, w_gate_up, w_down,
                     attrs=attrs)

    backward.def_vmap(no_vmap_of_gradients)
    return backward


def moe_backward_saved(kernel: KernelTuning, dy, x2d, topk_ids, topk_weights, w_gate_up, w_down,
                       h):
    """``mok_moe_bwd_saved`` (CUDA): as :func:`moe_backward`, reading the saved ``h``."""
    outs = _backward_outs(x2d, topk_weights, w_gate_up, w_down)
    attrs = _local_attributes("mok_moe_bwd_saved", kernel, x2d, topk_ids, w_gate_up)
    return _call("mok_moe_bwd_saved", outs, dy, x2d, topk_ids, topk_weights, w_gate_up, w_down,
                 h, attrs=attrs)


def mx_qdq(x, axis: int):
    """``mok_mx_qdq`` (CUDA, bf16): deq(Q(x)) of mxfp8 along ``axis`` (the last of ``x [R, C]``,
    or 1 / 2 of weights ``[E, A, B]``) in x's shape, one pass."""
    return _call("mok_mx_qdq", _like(x), x, attrs={"axis": np.int32(axis)},
                 vmap_method="sequential")


def mx_forward(kernel: KernelTuning, x_mx, topk_ids, topk_weights, w_gate_up_mx, w_down_mx,
               save: bool):
    """``mok_moe_fwd_mx`` / ``_train_mx`` (``save``): the local forward on exactly dequantized
    mxfp8 operands (docs/ffi-contract.md) -> ``(y [T, H], h [T*k, 2F] or None)``."""
    target = "mok_moe_fwd_train_mx" if save else "mok_moe_fwd_mx"
    h = jax.ShapeDtypeStruct((topk_ids.size, w_gate_up_mx.shape[-1]), x_mx.dtype)
    out = _call(target, (_like(x_mx), h) if save else _like(x_mx), x_mx, topk_ids, topk_weights,
                w_gate_up_mx, w_down_mx,
                attrs=_local_attributes(target, kernel, x_mx, topk_ids, w_gate_up_mx))
    return out if save else (out, None)


def mx_backward_saved(kernel: KernelTuning, dy_mx, dy, x2d, topk_ids, topk_weights,
                      w_gate_up_mx, w_down_mx, h, qdq_weights: bool):
    """``mok_moe_bwd_saved_mx``: :func:`moe_backward_saved` with deq(Q(dy)) and deq(Q(dh)) as
    the data gradients' operands and the backward's dequantized weight layouts (``qdq_weights``:
    the weights themselves, their layouts made in the call, one at a time)."""
    attrs = _local_attributes("mok_moe_bwd_saved_mx", kernel, x2d, topk_ids, w_gate_up_mx)
    attrs["qdq_weights"] = np.int32(qdq_weights)  # what the call computes from, not tuning
    return _call("mok_moe_bwd_saved_mx", _backward_outs(x2d, topk_weights, w_gate_up_mx,
                                                        w_down_mx),
                 dy_mx, dy, x2d, topk_ids, topk_weights, w_gate_up_mx, w_down_mx, h, attrs=attrs)


# ------------------------------------------------------------------ expert parallelism

@jax.custom_batching.custom_vmap
def home_sum(buffer: jax.Array, home_row: jax.Array) -> jax.Array:
    """``mok_home_sum`` (CUDA): ``y [T, H]`` float32, ``y[t] = sum over d = 0..EP-1 with
    home_row[t, d] >= 0 of buffer[d, home_row[t, d]]`` in ascending ``d`` (``buffer [EP, R, H]``
    bf16 / f32 with 16-byte rows, ``home_row [T, EP]`` int32). Under ``jax.vmap`` the batch is
    folded into the rows and tokens: one call, the same sums in the same order."""
    out = jax.ShapeDtypeStruct((home_row.shape[0], buffer.shape[2]), jnp.float32)
    return _call("mok_home_sum", out, buffer, home_row, attrs={})


@home_sum.def_vmap
def _home_sum_vmap(axis_size, in_batched, buffer, home_row):
    batch = axis_size
    if not in_batched[0]:
        buffer = jnp.broadcast_to(buffer, (batch, *buffer.shape))
    if not in_batched[1]:
        home_row = jnp.broadcast_to(home_row, (batch, *home_row.shape))
    ep, rows, hidden = buffer.shape[1:]
    tokens = home_row.shape[1]
    # Chunk d of the folded buffer is [batch 0's R rows, batch 1's, ...]: row r of batch b is
    # row b * R + r there.
    folded = jnp.moveaxis(buffer, 0, 1).reshape(ep, batch * rows, hidden)
    offset = (jnp.arange(batch, dtype=jnp.int32) * rows)[:, None, None]
    home = jnp.where(home_row >= 0, home_row + offset, -1).reshape(batch * tokens, ep)
    return home_sum(folded, home).reshape(batch, tokens, hidden), True


# The peer calls under jax.vmap run once per example, in order (vmap_method="sequential"): their
# workspace is sized for one call's rows, and every rank issues the same sequence of calls.
_PEER_VMAP = "sequential"


def ep_dispatch(x, ids, w, workspace_id: int, phase: int, peer: PeerTuning):
    """``mok_ep_dispatch``: all-to-all over peer memory of ``x [EP, R, H]``, ``ids [EP, R, k]``
    int32, ``w [EP, R, k]`` float32: chunk ``d`` goes to rank ``d``, chunk ``s`` of each result
    came from rank ``s``. ``phase``: which exchange of a step (jax_mok.ep.peer)."""
    attrs = {"workspace_id": np.int64(workspace_id), "phase": np.int32(phase),
             **attributes("mok_ep_dispatch", peer=peer)}
    return _call("mok_ep_dispatch", tuple(_like(a) for a in (x, ids, w)), x, ids, w,
                 attrs=attrs, has_side_effect=True, vmap_method=_PEER_VMAP)


def ep_combine(rows, home_row, workspace_id: int, phase: int, peer: PeerTuning):
    """``mok_ep_combine``: ``rows [EP, R, H]`` (chunk ``s``: results for the rows rank ``s``
    sent here) go home and are summed per token in rank order -> ``y [T, H]`` float32."""
    T, H = home_row.shape[0], rows.shape[-1]
    attrs = {"workspace_id": np.int64(workspace_id), "phase": np.int32(phase),
             **attributes("mok_ep_combine", peer=peer)}
    return _call("mok_ep_combine", jax.ShapeDtypeStruct((T, H), jnp.float32), rows, home_row,
                 attrs=attrs, has_side_effect=True, vmap_method=_PEER_VMAP)


def _fused_attributes(target: str, send_ids, w_gate_up, w_down, rows: int, tuning_kernel,
                      tuning_peer) -> dict:
    return attributes(target, kernel=tuning_kernel, peer=tuning_peer, ffn_size=w_down.shape[1],
                      assignments=rows * send_ids.shape[-1], num_experts=w_gate_up.shape[0])


def ep_moe_forward(send_x, send_ids, send_w, home_row, w_gate_up, w_down, workspace_id: int,
                   kernel: KernelTuning, peer: PeerTuning):
    """``mok_ep_moe_fwd``: dispatch, this rank's experts on the rows where they land, combine;
    ``y [T, H]`` float32 (operands as :func:`ep_dispatch`, ``home_row [T, EP]`` int32, this
    rank's experts ``[E_loc, H, 2F]``, ``[E_loc, F, H]``)."""
    T, H = home_row.shape[0], send_x.shape[-1]
    ep, rows = send_x.shape[:2]
    attrs = _fused_attributes("mok_ep_moe_fwd", send_ids, w_gate_up, w_down, ep * rows, kernel,
                              peer)
    return _call("mok_ep_moe_fwd", jax.ShapeDtypeStruct((T, H), jnp.float32), send_x, send_ids,
                 send_w, home_row, w_gate_up, w_down,
                 attrs={"workspace_id": np.int64(workspace_id), **attrs}, has_side_effect=True,
                 vmap_method=_PEER_VMAP)


def ep_moe_forward_train(send_x, send_ids, send_w, home_row, w_gate_up, w_down,
                         workspace_id: int, save: bool, kernel: KernelTuning, peer: PeerTuning):
    """``mok_ep_moe_fwd_train``: :func:`ep_moe_forward` that also hands back the received rows
    ``x [EP*R, H]``, ``ids``, ``weights [EP*R, k]`` and, when ``save``, ``h [EP*R*k, 2F]``
    (else None: ``mok_ep_moe_fwd_train_recompute``, no call takes or returns an empty buffer):
    the operands of :func:`ep_moe_backward`."""
    ep, rows, H = send_x.shape
    k = send_ids.shape[-1]
    n = ep * rows
    outs = (jax.ShapeDtypeStruct((home_row.shape[0], H), jnp.float32),
            jax.ShapeDtypeStruct((n, H), send_x.dtype),
            jax.ShapeDtypeStruct((n, k), jnp.int32),
            jax.ShapeDtypeStruct((n, k), jnp.float32))
    target = "mok_ep_moe_fwd_train" if save else "mok_ep_moe_fwd_train_recompute"
    if save:
        outs += (jax.ShapeDtypeStruct((n * k, w_gate_up.shape[-1]), send_x.dtype),)
    attrs = _fused_attributes(target, send_ids, w_gate_up, w_down, n, kernel, peer)
    results = _call(target, outs, send_x, send_ids, send_w, home_row, w_gate_up, w_down,
                    attrs={"workspace_id": np.int64(workspace_id), **attrs},
                    has_side_effect=True, vmap_method=_PEER_VMAP)
    return tuple(results) if save else (*results, None)


def ep_moe_backward(dy_rows, x2d, ids2d, w2d, w_gate_up, w_down, h, workspace_id: int,
                    kernel: KernelTuning, peer: PeerTuning):
    """``mok_ep_moe_bwd``: the reverse combine of ``dy_rows [EP, R, H]``, the local backward,
    the reverse dispatch of dx and d_topk_weights -> ``(dx [EP, R, H], d_w [EP, R, k] f32,
    d_w_gate_up, d_w_down)``. ``h`` None: ``mok_ep_moe_bwd_recompute``, which recomputes the
    gate/up GEMM."""
    outs = (_like(dy_rows),
            jax.ShapeDtypeStruct((*dy_rows.shape[:2], ids2d.shape[1]), jnp.float32),
            _like(w_gate_up), _like(w_down))
    target = "mok_ep_moe_bwd" if h is not None else "mok_ep_moe_bwd_recompute"
    attrs = _fused_attributes(target, ids2d, w_gate_up, w_down, x2d.shape[0], kernel, peer)
    operands = (dy_rows, x2d, ids2d, w2d, w_gate_up, w_down) + ((h,) if h is not None else ())
    return _call(target, outs, *operands, attrs={"workspace_id": np.int64(workspace_id), **attrs},
                 has_side_effect=True, vmap_method=_PEER_VMAP)


# ------------------------------------------------------------------ FP8 (CUDA)
# Operands are E4M3 values with their scales (jax_mok.quantization), every one K-major (the
# reduction dim last): x / dy [T, H] along H; the forward's weights w_gate_up [E, 2F, H] and
# w_down [E, H, F]; the backward's w_down [E, F, H] (along H) and w_gate_up [E, H, 2F] (along
# 2F). Attribute `recipe`: 1 mxfp8, 2 fp8_block (FP8_RECIPES).
FP8_RECIPES = {"mxfp8": 1, "fp8_block": 2}


def fp8_forward(x_q, topk_ids, topk_weights, w_gate_up_q, w_down_q, recipe: str, dtype,
                save: bool):
    """``mok_moe_fwd_fp8`` (``save``: ``mok_moe_fwd_train_fp8``): ``x_q``, ``w_*_q`` are
    ``(values, scales)`` pairs; returns ``(y [T, H] in dtype, h [T*k, 2F] in dtype or None)``."""
    T, H = x_q[0].shape
    F = w_down_q[0].shape[-1]
    y = jax.ShapeDtypeStruct((T, H), dtype)
    operands = (*x_q, topk_ids, topk_weights, *w_gate_up_q, *w_down_q)
    code = np.int32(FP8_RECIPES[recipe])
    if save:
        h = jax.ShapeDtypeStruct((T * topk_ids.shape[1], 2 * F), dtype)
        return _call("mok_moe_fwd_train_fp8", (y, h), *operands, attrs={"recipe": code})
    return _call("mok_moe_fwd_fp8", y, *operands, attrs={"recipe": code}), None


FP8_WEIGHT_GRADS = {"fp8": 0, "unquantized": 1}  # the backward's attribute weight_grads


def fp8_backward(dy, dy_q, x2d, x_q, topk_ids, topk_weights, w_gate_up_fwd, w_down_bwd,
                 w_gate_up_bwd, h, recipe: str, weight_grads: str = "fp8",
                 pregather: bool | None = None):
    """``mok_moe_bwd_fp8`` (``h`` given: ``mok_moe_bwd_saved_fp8``) -> ``(dx [T, H],
    d_topk_weights [T, k] f32, d_w_gate_up [E, H, 2F], d_w_down [E, F, H])`` in dy's dtype.
    ``w_gate_up_fwd`` (the forward's layout) recomputes h; with ``h`` given it is not read and may
    be None, so that a caller need not keep it alive until the backward. ``weight_grads``:
    ``"fp8"`` (FP8 GEMMs on the operands quantized along tokens) or ``"unquantized"`` (GEMMs in
    dy's dtype on x, dy, w·a and dh as they are). ``pregather`` (unquantized weight gradients):
    x and dy copied into expert order for those GEMMs, or gathered by them (the same bits);
    ``None``: :func:`jax_mok.tuning.pregather_backward_heuristic`."""
    E, H, two_f = w_gate_up_bwd[0].shape
    T, k = topk_ids.shape
    dtype = dy.dtype
    outs = (jax.ShapeDtypeStruct((T, H), dtype), jax.ShapeDtypeStruct((T, k), jnp.float32),
            jax.ShapeDtypeStruct((E, H, two_f), dtype),
            jax.ShapeDtypeStruct((E, two_f // 2, H), dtype))
    head = [dy, *dy_q, x2d, *x_q, topk_ids, topk_weights]
    attrs = {"recipe": np.int32(FP8_RECIPES[recipe]),
             "weight_grads": np.int32(FP8_WEIGHT_GRADS[weight_grads]),
             "pregather_x": np.int32(pregather_backward_heuristic(two_f // 2)
                                     if pregather is None else pregather)}
    if h is not None:
        return _call("mok_moe_bwd_saved_fp8", outs, *head, *w_down_bwd, *w_gate_up_bwd, h,
                     attrs=attrs)
    return _call("mok_moe_bwd_fp8", outs, *head, *w_gate_up_fwd, *w_down_bwd, *w_gate_up_bwd,
                 attrs=attrs)


def quantize_rows(x, recipe: str):
    """``mok_quantize`` (CUDA): ``x [R, C]`` (C a multiple of 128) quantized along C by the
    kernels' own quantizer -> ``(values [R, C] e4m3, scales)``, the bits of
    ``jax_mok.quantization.quantize(x, recipe)`` (the GPU tests compare them)."""
    R, C = x.shape
    if recipe == "mxfp8":
        scales = jax.ShapeDtypeStruct((R, C // 32), jnp.float8_e8m0fnu)
    else:
        scales = jax.ShapeDtypeStruct((R, C // 128), jnp.float32)
    values = jax.ShapeDtypeStruct((R, C), jnp.float8_e4m3fn)
    return _call("mok_quantize", (values, scales), x,
                 attrs={"recipe": np.int32(FP8_RECIPES[recipe])}, vmap_method="sequential")


def _weight_layout(w, recipe: str, axis: int):
    """The ShapeDtypeStructs of ``w [E, A, B]`` quantized along ``axis`` (1: A, 2: B), reduction
    dim last: values ``[E, B, A]`` / ``[E, A, B]`` and the recipe's weight scales."""
    E, A, B = w.shape
    rows, k = (B, A) if axis == 1 else (A, B)
    values = jax.ShapeDtypeStruct((E, rows, k), jnp.float8_e4m3fn)
    if recipe == "mxfp8":
        scales = jax.ShapeDtypeStruct((E, rows, k // 32), jnp.float8_e8m0fnu)
    else:
        scales = jax.ShapeDtypeStruct((E, rows // 128, k // 128), jnp.float32)
    return values, scales


def quantize_weight(w, recipe: str, axis: int):
    """``mok_quantize_weight`` (CUDA): expert weights ``w [E, A, B]`` (A, B multiples of 128)
    quantized along ``axis`` (1 or 2) in one pass -> ``(values, scales)`` with the reduction dim
    last, the bits of ``jax_mok.quantization.QuantizedWeight.quantize(w, recipe, axis)``."""
    return _call("mok_quantize_weight", _weight_layout(w, recipe, axis), w,
                 attrs={"recipe": np.int32(FP8_RECIPES[recipe]), "axis": np.int32(axis)},
                 vmap_method="sequential")


def quantize_weight_both(w, recipe: str):
    """``mok_quantize_weight_both`` (CUDA): ``w [E, A, B]`` read once, written along A and along
    B -> ``((values, scales) along A, (values, scales) along B)``."""
    outs = (*_weight_layout(w, recipe, 1), *_weight_layout(w, recipe, 2))
    a_v, a_s, b_v, b_s = _call("mok_quantize_weight_both", outs, w,
                               attrs={"recipe": np.int32(FP8_RECIPES[recipe])},
                               vmap_method="sequential")
    return (a_v, a_s), (b_v, b_s)


__all__ = ["FP8_RECIPES", "FUSED_PEER_TARGETS", "BACKWARD_TARGETS", "KERNEL_TARGETS",
           "MX_TARGETS", "STAGED_PEER_TARGETS", "attributes", "ep_combine", "ep_dispatch",
           "ep_moe_backward", "ep_moe_forward", "ep_moe_forward_train", "fp8_backward",
           "fp8_forward", "home_sum", "moe_backward", "moe_backward_saved", "moe_forward",
           "moe_forward_train", "mx_backward_saved", "mx_forward", "mx_qdq",
           "no_vmap_of_gradients", "quantize_rows", "quantize_weight", "quantize_weight_both"]
