"""JAX side of the ``"peer"`` transport: ``mok_ep_dispatch`` / ``mok_ep_combine`` and their
transposes, called per device inside the ``shard_map`` of :mod:`jax_mok.sharding`.

Status (2026-11-29): run on 2 x H200 (docs/peer-transport.md, tools/gpu_check_ep.sh): the
exchange is bitwise equal to ``lax.all_to_all``; values and gradients match transport "xla".

Both targets are ``has_side_effect=True``: every rank must issue the same sequence of peer calls
(the kernels advance a device-side epoch per call), so XLA must neither drop nor merge them.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

DISPATCH, COMBINE, REVERSE_DISPATCH, REVERSE_COMBINE = 0, 1, 2, 3

# Test seam: an object with ``exchange(x, ids, w, workspace_id, phase)`` and ``combine(rows,
# home_row, workspace_id, phase)`` standing in for the two FFI calls. tests/test_peer_transport.py
# emulates the transport on CPU devices with host callbacks to check this module's glue
# (packing, transposes) against transport "xla". None: the FFI targets.
_backend = None


def _exchange(x, ids, w, workspace_id: int, phase: int):
    """All-to-all over peer memory: chunk ``d`` of each operand ``[EP, ...]`` goes to rank ``d``;
    chunk ``s`` of each result came from rank ``s``."""
    if _backend is not None:
        return _backend.exchange(x, ids, w, workspace_id, phase)
    outs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, ids, w))
    call = jax.ffi.ffi_call("mok_ep_dispatch", outs, has_side_effect=True)
    return call(x, ids, w, workspace_id=np.int64(workspace_id), phase=np.int32(phase))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def dispatch(x: jax.Array, ids: jax.Array, w: jax.Array, workspace_id: int):
    """Sends packed rows to the ranks that own their experts.

    Args:
      x: ``[EP, R, H]`` rows for each destination rank (x's dtype).
      ids: ``[EP, R, k]`` int32 local expert ids at the destination (-1: not for it).
      w: ``[EP, R, k]`` float32 routing weights.
      workspace_id: from :func:`jax_mok.workspace.workspace_for` (static).

    Returns:
      ``(recv_x, recv_ids, recv_w)`` with the same shapes; chunk ``s`` came from rank ``s``.
    """
    return _exchange(x, ids, w, workspace_id, DISPATCH)


def _dispatch_fwd(x, ids, w, workspace_id):
    return _exchange(x, ids, w, workspace_id, DISPATCH), ids


def _dispatch_bwd(workspace_id, ids, cotangents):
    # all_to_all is its own transpose: send the cotangents back the same way.
    ct_x, _, ct_w = cotangents
    back_x, _, back_w = _exchange(ct_x, jnp.zeros(ids.shape, jnp.int32),
                                  ct_w.astype(jnp.float32), workspace_id, REVERSE_DISPATCH)
    return back_x, None, back_w


dispatch.defvjp(_dispatch_fwd, _dispatch_bwd)


def _combine_call(rows, home_row, workspace_id: int, phase: int):
    if _backend is not None:
        return _backend.combine(rows, home_row, workspace_id, phase)
    T, H = home_row.shape[0], rows.shape[-1]
    call = jax.ffi.ffi_call("mok_ep_combine", jax.ShapeDtypeStruct((T, H), jnp.float32),
                            has_side_effect=True)
    return call(rows, home_row, workspace_id=np.int64(workspace_id), phase=np.int32(phase))


def combine(rows: jax.Array, home_row: jax.Array, workspace_id: int,
            source_token: jax.Array | None = None) -> jax.Array:
    """Sends each rank's expert results home and reduces them per token in rank order.

    Args:
      rows: ``[EP, R, H]``: chunk ``s`` = this rank's (already k-reduced) results for the rows
        that rank ``s`` sent here.
      home_row: ``[T, EP]`` int32: the row of token ``t`` in the chunk it sent to rank ``d``, or
        -1 when it sent nothing there.
      workspace_id: static.
      source_token: ``[EP, R]`` int32, the token of each row this rank sent (``T`` on padding),
        when the caller has it: the backward then gathers ``dy`` into rows instead of scattering
        it (the same values).

    Returns:
      ``y [T, H]`` float32, ``y[t] = sum_{d = 0..EP-1, home_row[t, d] >= 0} result_d[home_row]``.
    """
    if source_token is None:
        source_token = jnp.zeros((0, 0), jnp.int32)
    return _combine(rows, home_row, source_token, workspace_id)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _combine(rows, home_row, source_token, workspace_id):
    return _combine_call(rows, home_row, workspace_id, COMBINE)


def _combine_fwd(rows, home_row, source_token, workspace_id):
    # A zero-size array carries R and the dtype (residuals must be arrays).
    like = jnp.zeros((0, rows.shape[1]), rows.dtype)
    return _combine_call(rows, home_row, workspace_id, COMBINE), (home_row, source_token, like)


def _combine_bwd(workspace_id, residuals, ct_y):
    home_row, source_token, like = residuals
    (T, ep), R, H, dtype = home_row.shape, like.shape[1], ct_y.shape[1], like.dtype
    # Reverse combine: dy of token t goes to row home_row[t, d] of the chunk for rank d.
    if source_token.size:  # a gather by each row's token
        from jax_mok.sharding import _gather_rows

        grad = _gather_rows(ct_y.astype(dtype), jnp.minimum(source_token, T - 1),
                            source_token >= T)
    else:  # a scatter by each token's rows
        dests = jnp.broadcast_to(jnp.arange(ep, dtype=jnp.int32)[None, :], (T, ep))
        rows_idx = jnp.where(home_row >= 0, home_row, R)  # R: out of range, dropped
        grad = jnp.zeros((ep, R, H), dtype).at[dests, rows_idx].set(
            jnp.broadcast_to(ct_y.astype(dtype)[:, None, :], (T, ep, H)), mode="drop")
    dummy_ids = jnp.zeros((ep, 1, 1), jnp.int32)
    dummy_w = jnp.zeros((ep, 1, 1), jnp.float32)
    back, _, _ = _exchange(grad, dummy_ids, dummy_w, workspace_id, REVERSE_COMBINE)
    return back, None, None


_combine.defvjp(_combine_fwd, _combine_bwd)


def fused_enabled() -> bool:
    """``JAX_MOK_PEER_FUSED`` (default on; ``0`` = the staged calls also for inference), read
    at trace time."""
    return os.environ.get("JAX_MOK_PEER_FUSED", "1") != "0"


def _staged_experts(send_x, send_ids, send_w, home_row, source_token, w_gate_up, w_down,
                    workspace_id, implementation, save_activations):
    """dispatch -> the local experts on every received row -> combine (three calls)."""
    from jax_mok.sharding import _experts_on_rows  # sharding imports this module lazily

    received = dispatch(send_x, send_ids, send_w, workspace_id)
    out = _experts_on_rows(*received, w_gate_up, w_down, implementation, save_activations)
    return combine(out, home_row, workspace_id, source_token)


def _fused_call(send_x, send_ids, send_w, home_row, w_gate_up, w_down, workspace_id):
    T, H = home_row.shape[0], send_x.shape[-1]
    call = jax.ffi.ffi_call("mok_ep_moe_fwd", jax.ShapeDtypeStruct((T, H), jnp.float32),
                            has_side_effect=True)
    return call(send_x, send_ids, send_w, home_row, w_gate_up, w_down,
                workspace_id=np.int64(workspace_id))


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def experts_over_peers(send_x: jax.Array, send_ids: jax.Array, send_w: jax.Array,
                       home_row: jax.Array, source_token: jax.Array, w_gate_up: jax.Array,
                       w_down: jax.Array, workspace_id: int, implementation: str = "ffi",
                       save_activations: bool | None = None) -> jax.Array:
    """Dispatch, this rank's experts, combine: ``y [T, H]`` float32 (the shared expert not
    included).

    Not differentiated (inference, or the forward of a benchmark), and with the CUDA kernels
    (``implementation`` ``"ffi"`` or ``"cuda"``), this is ONE call, ``mok_ep_moe_fwd``: the rows
    land in the workspace and the expert GEMMs read them there, with no host round trip between
    the phases and no copy of the received rows. Under differentiation the forward is one
    ``mok_ep_moe_fwd_train`` call (the same, also handing back the received rows and the saved
    pre-activations) and the backward one ``mok_ep_moe_bwd`` call (the reverse combine of dy,
    the local backward, the reverse dispatch of dx and d_topk_weights). ``JAX_MOK_PEER_FUSED=0``
    / ``JAX_MOK_PEER_FUSED_BWD=0`` (read at trace time) select the staged calls instead
    (:func:`dispatch`, the local kernels, :func:`combine`, and their transposes). Every
    combination gives the same bits (tests/test_peer_transport.py).

    Args:
      send_x, send_ids, send_w: as :func:`dispatch`.
      home_row, source_token: as :func:`combine`.
      w_gate_up, w_down: this rank's experts ``[E_loc, H, 2F]``, ``[E_loc, F, H]`` (x's dtype).
      workspace_id, implementation, save_activations: static.
    """
    if _backend is None and implementation in ("ffi", "cuda") and fused_enabled():
        return _fused_call(send_x, send_ids, send_w, home_row, w_gate_up, w_down, workspace_id)
    return _staged_experts(send_x, send_ids, send_w, home_row, source_token, w_gate_up, w_down,
                           workspace_id, implementation, save_activations)


def fused_backward_enabled() -> bool:
    """``JAX_MOK_PEER_FUSED_BWD`` (default on; ``0`` = the staged calls' VJP): the backward as
    one call, ``mok_ep_moe_bwd``; read at trace time."""
    return os.environ.get("JAX_MOK_PEER_FUSED_BWD", "1") != "0"


def _fused_train_call(send_x, send_ids, send_w, home_row, w_gate_up, w_down, workspace_id,
                      save: bool):
    """The fused forward of a training step: ``y`` and the received rows ``x [EP*R, H]``,
    ``ids``, ``weights [EP*R, k]`` and, when ``save``, ``h [EP*R*k, 2F]`` (else empty)."""
    ep, rows, H = send_x.shape
    k = send_ids.shape[-1]
    n = ep * rows
    outs = (jax.ShapeDtypeStruct((home_row.shape[0], H), jnp.float32),
            jax.ShapeDtypeStruct((n, H), send_x.dtype),
            jax.ShapeDtypeStruct((n, k), jnp.int32),
            jax.ShapeDtypeStruct((n, k), jnp.float32),
            jax.ShapeDtypeStruct((n * k, w_gate_up.shape[-1]) if save else (0,), send_x.dtype))
    call = jax.ffi.ffi_call("mok_ep_moe_fwd_train", outs, has_side_effect=True)
    return call(send_x, send_ids, send_w, home_row, w_gate_up, w_down,
                workspace_id=np.int64(workspace_id))


def _fused_bwd_call(dy_rows, x2d, ids2d, w2d, w_gate_up, w_down, h, workspace_id):
    outs = (jax.ShapeDtypeStruct(dy_rows.shape, dy_rows.dtype),
            jax.ShapeDtypeStruct((*dy_rows.shape[:2], ids2d.shape[1]), jnp.float32),
            jax.ShapeDtypeStruct(w_gate_up.shape, w_gate_up.dtype),
            jax.ShapeDtypeStruct(w_down.shape, w_down.dtype))
    call = jax.ffi.ffi_call("mok_ep_moe_bwd", outs, has_side_effect=True)
    return call(dy_rows, x2d, ids2d, w2d, w_gate_up, w_down, h,
                workspace_id=np.int64(workspace_id))


def _experts_fwd(send_x, send_ids, send_w, home_row, source_token, w_gate_up, w_down,
                 workspace_id, implementation, save_activations):
    if _backend is None and implementation in ("ffi", "cuda") and fused_backward_enabled():
        from jax_mok import autodiff

        save = autodiff._save_activations(implementation, save_activations)
        if fused_enabled():  # one call that also hands back the fused backward's operands
            y, x2d, ids2d, w2d, h = _fused_train_call(send_x, send_ids, send_w, home_row,
                                                      w_gate_up, w_down, workspace_id, save)
            return y, ((x2d, ids2d, w2d, w_gate_up, w_down), h, source_token)
        # JAX_MOK_PEER_FUSED=0: the staged forward with its residuals kept by hand.
        ep, rows, H = send_x.shape
        recv_x, recv_ids, recv_w = dispatch(send_x, send_ids, send_w, workspace_id)
        operands = (recv_x.reshape(ep * rows, H), recv_ids.reshape(ep * rows, -1),
                    recv_w.reshape(ep * rows, -1), w_gate_up, w_down)
        if save:
            out, h = autodiff._ffi_forward_train(*operands)
        else:
            out, h = autodiff._ffi_forward(*operands), jnp.zeros((0,), send_x.dtype)
        y = combine(out.reshape(ep, rows, H), home_row, workspace_id, source_token)
        return y, (operands, h, source_token)  # three entries: the fused backward

    def staged(x, w, gu, dn):
        return _staged_experts(x, send_ids, w, home_row, source_token, gu, dn, workspace_id,
                               implementation, save_activations)

    y, vjp = jax.vjp(staged, send_x, send_w, w_gate_up, w_down)
    return y, (vjp,)  # one entry: the staged calls' VJP


def _experts_bwd(workspace_id, implementation, save_activations, residuals, ct_y):
    if len(residuals) == 3:
        from jax_mok.sharding import _gather_rows

        (x2d, ids2d, w2d, w_gate_up, w_down), h, source_token = residuals
        T = ct_y.shape[0]
        dy_rows = _gather_rows(ct_y.astype(x2d.dtype), jnp.minimum(source_token, T - 1),
                               source_token >= T)  # [EP, R, H]
        d_x, d_w, d_gu, d_dn = _fused_bwd_call(dy_rows, x2d, ids2d, w2d, w_gate_up, w_down, h,
                                               workspace_id)
        return d_x, None, d_w, None, None, d_gu, d_dn
    d_x, d_w, d_gu, d_dn = residuals[0](ct_y)
    return d_x, None, d_w, None, None, d_gu, d_dn


experts_over_peers.defvjp(_experts_fwd, _experts_bwd)


__all__ = ["combine", "dispatch", "experts_over_peers", "fused_backward_enabled", "fused_enabled"]
