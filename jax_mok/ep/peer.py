"""The ``"peer"`` transport: rows travel through a symmetric workspace in NVLink peer memory
(docs/peer-transport.md), called per device inside the ``shard_map`` of :mod:`jax_mok.ep.layer`.

With the CUDA kernels (``implementation`` ``"ffi"`` or ``"cuda"``) each direction is one call:
``mok_ep_moe_fwd`` when not differentiated; under differentiation ``mok_ep_moe_fwd_train`` (the
same, also handing back the received rows and the saved pre-activations) and ``mok_ep_moe_bwd``
(the reverse combine of dy, the local backward, the reverse dispatch of dx and d_topk_weights).
The rows land in the workspace and the expert GEMMs read them there: no host round trip between
the phases and no copy of the received rows.

Where the experts are not the CUDA kernels (``implementation="reference"``, or the CPU-emulated
exchange of tests/test_peer_transport.py), the staged calls run instead: :func:`dispatch`, the
experts, :func:`combine`, each exchange a ``mok_ep_dispatch`` / ``mok_ep_combine`` call with a
``phase`` naming its place in the step, and their transposes.

With an FP8 recipe (``MoEConfig.quantization``) the staged calls run whatever the experts: the
rows to the experts (x forward, dy backward) travel as :func:`jax_mok.quantization.rows.pack_rows`
bytes, E4M3 values and the recipe's scales in one uint8 row (0.52x a bfloat16 row), the bytes the
XLA transport moves, and arrive as float32 ``deq(Q(rows))``; the results come home in x's dtype.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jax_mok.ep.pack import Packed, gather_rows
from jax_mok.ep.transport import experts_on_rows
from jax_mok.kernels import autodiff, targets
from jax_mok.quantization import rows as fp8_rows
from jax_mok.tuning import KernelTuning, PeerTuning, Tuning

DISPATCH, COMBINE, REVERSE_DISPATCH, REVERSE_COMBINE = 0, 1, 2, 3

# Test seam: an object with ``exchange(x, ids, w, workspace_id, phase)`` and ``combine(rows,
# home_row, workspace_id, phase)`` standing in for the two staged FFI calls.
# tests/test_peer_transport.py emulates the transport on CPU devices with host callbacks to check
# this module's glue (packing, transposes) against transport "xla". None: the FFI targets.
_backend = None


def _exchange(x, ids, w, workspace_id: int, phase: int, peer: PeerTuning):
    """All-to-all over peer memory: chunk ``d`` of each operand ``[EP, ...]`` goes to rank ``d``;
    chunk ``s`` of each result came from rank ``s``."""
    if _backend is not None:
        return _backend.exchange(x, ids, w, workspace_id, phase)
    return targets.ep_dispatch(x, ids, w, workspace_id, phase, peer)


def _combine_call(rows, home_row, workspace_id: int, phase: int, peer: PeerTuning):
    if _backend is not None:
        return _backend.combine(rows, home_row, workspace_id, phase)
    return targets.ep_combine(rows, home_row, workspace_id, phase, peer)


def dispatch(x: jax.Array, ids: jax.Array, w: jax.Array, workspace_id: int,
             peer: PeerTuning | None = None, recipe: str | None = None):
    """Sends packed rows to the ranks that own their experts.

    Args:
      x: ``[EP, R, H]`` rows for each destination rank (x's dtype).
      ids: ``[EP, R, k]`` int32 local expert ids at the destination (-1: not for it).
      w: ``[EP, R, k]`` float32 routing weights.
      workspace_id: from :func:`jax_mok.ep.workspace.workspace_for` (static).
      peer: the exchange's :class:`jax_mok.PeerTuning` (None: the defaults).
      recipe: an FP8 recipe: the rows travel quantized and arrive as float32 ``deq(Q(x))``;
        their cotangent goes back in x's dtype (straight through). None: as they are.

    Returns:
      ``(recv_x, recv_ids, recv_w)`` with the same shapes; chunk ``s`` came from rank ``s``.
    """
    return _dispatch(x, ids, w, workspace_id, peer or PeerTuning(), recipe)


def _exchange_rows(rows, ids, w, workspace_id: int, phase: int, peer: PeerTuning,
                   recipe: str | None):
    """:func:`_exchange` of rows towards the experts: with an FP8 recipe they travel packed
    (:func:`jax_mok.quantization.rows.pack_rows`) and arrive as float32 ``deq(Q(rows))``."""
    if recipe is None:
        return _exchange(rows, ids, w, workspace_id, phase, peer)
    got, rids, rw = _exchange(fp8_rows.pack_rows(rows, recipe), ids, w, workspace_id, phase, peer)
    return fp8_rows.unpack_rows(got, recipe, rows.shape[-1]), rids, rw


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _dispatch(x, ids, w, workspace_id, peer, recipe):
    return _exchange_rows(x, ids, w, workspace_id, DISPATCH, peer, recipe)


def _dispatch_fwd(x, ids, w, workspace_id, peer, recipe):
    # A zero-size slice carries x's dtype (residuals must be arrays).
    out = _exchange_rows(x, ids, w, workspace_id, DISPATCH, peer, recipe)
    return out, (ids, x.reshape(-1)[:0])


def _dispatch_bwd(workspace_id, peer, recipe, residuals, cotangents):
    # all_to_all is its own transpose: send the cotangents back the same way (FP8: straight
    # through, in x's dtype, as the XLA transport's).
    del recipe
    ids, like = residuals
    ct_x, _, ct_w = cotangents
    back_x, _, back_w = _exchange(ct_x.astype(like.dtype), jnp.zeros(ids.shape, jnp.int32),
                                  ct_w.astype(jnp.float32), workspace_id, REVERSE_DISPATCH, peer)
    return back_x, None, back_w


_dispatch.defvjp(_dispatch_fwd, _dispatch_bwd)


def combine(rows: jax.Array, home_row: jax.Array, workspace_id: int,
            source_token: jax.Array | None = None, peer: PeerTuning | None = None,
            recipe: str | None = None, dtype=None) -> jax.Array:
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
      peer: the exchange's :class:`jax_mok.PeerTuning` (None: the defaults).
      recipe: an FP8 recipe: the cotangent rows (dy) travel to the experts quantized and arrive
        as float32 ``deq(Q(dy))`` (rows' dtype then float32). None: unquantized.
      dtype: the dtype the rows travel home in (x's; None: the rows' own).

    Returns:
      ``y [T, H]`` float32, ``y[t] = sum_{d = 0..EP-1, home_row[t, d] >= 0} result_d[home_row]``.
    """
    if source_token is None:
        source_token = jnp.zeros((0, 0), jnp.int32)
    dtype = jnp.dtype(rows.dtype if dtype is None else dtype)
    return _combine(rows, home_row, source_token, workspace_id, peer or PeerTuning(), recipe,
                    dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _combine(rows, home_row, source_token, workspace_id, peer, recipe, dtype):
    del recipe
    return _combine_call(rows.astype(dtype), home_row, workspace_id, COMBINE, peer)


def _combine_fwd(rows, home_row, source_token, workspace_id, peer, recipe, dtype):
    del recipe
    # A zero-size array carries R and the rows' dtype (residuals must be arrays).
    like = jnp.zeros((0, rows.shape[1]), rows.dtype)
    y = _combine_call(rows.astype(dtype), home_row, workspace_id, COMBINE, peer)
    return y, (home_row, source_token, like)


def _combine_bwd(workspace_id, peer, recipe, dtype, residuals, ct_y):
    home_row, source_token, like = residuals
    (T, ep), R, H = home_row.shape, like.shape[1], ct_y.shape[1]
    # Reverse combine: dy of token t goes to row home_row[t, d] of the chunk for rank d, in the
    # dtype the rows went home in.
    if source_token.size:  # a gather by each row's token
        grad = gather_rows(ct_y.astype(dtype), jnp.minimum(source_token, T - 1),
                           source_token >= T)
    else:  # a scatter by each token's rows
        dests = jnp.broadcast_to(jnp.arange(ep, dtype=jnp.int32)[None, :], (T, ep))
        rows_idx = jnp.where(home_row >= 0, home_row, R)  # R: out of range, dropped
        grad = jnp.zeros((ep, R, H), dtype).at[dests, rows_idx].set(
            jnp.broadcast_to(ct_y.astype(dtype)[:, None, :], (T, ep, H)), mode="drop")
    dummy_ids = jnp.zeros((ep, 1, 1), jnp.int32)
    dummy_w = jnp.zeros((ep, 1, 1), jnp.float32)
    back, _, _ = _exchange_rows(grad, dummy_ids, dummy_w, workspace_id, REVERSE_COMBINE, peer,
                                recipe)
    return back.astype(like.dtype), None, None


_combine.defvjp(_combine_fwd, _combine_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10))
def _fused_experts(send_x, send_ids, send_w, home_row, source_token, w_gate_up, w_down,
                   workspace_id: int, save: bool, kernel: KernelTuning, peer: PeerTuning):
    """Dispatch, this rank's experts, combine as one ``mok_ep_moe_fwd`` call (two calls, one
    each way, under differentiation): ``y [T, H]`` float32."""
    del source_token, save  # the backward's
    return targets.ep_moe_forward(send_x, send_ids, send_w, home_row, w_gate_up, w_down,
                                  workspace_id, kernel, peer)


def _fused_experts_fwd(send_x, send_ids, send_w, home_row, source_token, w_gate_up, w_down,
                       workspace_id, save, kernel, peer):
    y, x2d, ids2d, w2d, h = targets.ep_moe_forward_train(
        send_x, send_ids, send_w, home_row, w_gate_up, w_down, workspace_id, save, kernel, peer)
    return y, (x2d, ids2d, w2d, w_gate_up, w_down, h, source_token)


def _fused_experts_bwd(workspace_id, save, kernel, peer, residuals, ct_y):
    x2d, ids2d, w2d, w_gate_up, w_down, h, source_token = residuals
    T = ct_y.shape[0]
    dy_rows = gather_rows(ct_y.astype(x2d.dtype), jnp.minimum(source_token, T - 1),
                          source_token >= T)  # [EP, R, H]
    d_x, d_w, d_gu, d_dn = targets.ep_moe_backward(dy_rows, x2d, ids2d, w2d, w_gate_up, w_down,
                                                   h, workspace_id, kernel, peer)
    return d_x, None, d_w, None, None, d_gu, d_dn


_fused_experts.defvjp(_fused_experts_fwd, _fused_experts_bwd)


def uses_fused_calls(implementation: str) -> bool:
    """Whether the peer transport runs the fused calls: with the CUDA kernels, unless the
    exchange is emulated (``_backend``)."""
    return _backend is None and implementation in ("ffi", "cuda")


@dataclasses.dataclass(frozen=True)
class PeerTransport:
    """The ``"peer"`` transport of one call (inside the layer's ``shard_map``).

    Attributes:
      workspace_id: from :func:`jax_mok.ep.workspace.workspace_for`.
      implementation, save_activations: of the local kernels.
      tuning: the call's resolved :class:`jax_mok.Tuning` (its ``kernel`` and ``peer`` parts).
      quantization: the FP8 recipe of the experts, or None (MoEConfig.quantization): with one,
        the staged calls with quantized rows (module docstring).
      weight_grads: the FP8 layer's weight-gradient mode ("fp8" under expert parallelism).
    """

    workspace_id: int
    implementation: str
    save_activations: bool | None
    tuning: Tuning
    quantization: str | None = None
    weight_grads: str = "fp8"

    def experts(self, packed: Packed, w_gate_up: jax.Array, w_down: jax.Array) -> jax.Array:
        kernel, peer, recipe = self.tuning.kernel, self.tuning.peer, self.quantization
        if recipe is None and uses_fused_calls(self.implementation):
            save = autodiff.resolve_save_activations(self.implementation, self.save_activations)
            return _fused_experts(packed.x, packed.ids, packed.weights, packed.home_row,
                                  packed.source_token, w_gate_up, w_down, self.workspace_id,
                                  save, kernel, peer)
        received = dispatch(packed.x, packed.ids, packed.weights, self.workspace_id, peer,
                            recipe)
        out = experts_on_rows(*received, w_gate_up, w_down, self.implementation,
                              self.save_activations, self.tuning, recipe, self.weight_grads)
        return combine(out, packed.home_row, self.workspace_id, packed.source_token, peer,
                       recipe, packed.x.dtype)


__all__ = ["COMBINE", "DISPATCH", "REVERSE_COMBINE", "REVERSE_DISPATCH", "PeerTransport",
           "combine", "dispatch", "uses_fused_calls"]
