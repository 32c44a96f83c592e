"""Packing for expert parallelism: capacity, where each token goes, the send buffers, and the
fixed-order per-token sum that brings results home. Runs per device inside the ``shard_map`` of
:mod:`jax_mok.ep.layer`; both transports share it.

A device's ``T`` tokens go to the ``EP`` devices of its expert group in chunks of ``R`` rows
(static): chunk ``d`` holds, in token order, each token with at least one slot for a local
expert of device ``d``, once. Row ``(d, r)`` of a buffer ``[EP, R, ...]`` carries token
``source_token[d, r]`` (``T`` on padding rows).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_mok.config import MoEConfig
from jax_mok.kernels import _ffi, targets, vma
from jax_mok.routing import DROPPED, rank_in_group


def buffer_rows(config: MoEConfig, tokens_local: int, tokens_global: int, ep: int) -> int:
    """Static rows ``R`` of each (source, destination) chunk, safe against overflow: ``T_loc``
    when dropless (a token goes at most once to each device), ``min(T_loc, E_loc * C)`` with a
    capacity ``C`` per expert (no device can be sent more than ``C`` assignments per local
    expert once capacity is applied)."""
    capacity = config.capacity(tokens_global)
    if capacity is None:
        return tokens_local
    return max(1, min(tokens_local, (config.num_experts // ep) * capacity))


def global_capacity(ids: jax.Array, config: MoEConfig, token_axes: tuple[str, ...],
                    tokens_global: int) -> jax.Array:
    """Single-device capacity semantics on sharded tokens: -1 past an expert's global capacity.

    Assignments are ranked per expert in global token order: the count of earlier devices
    (all-gathered, ``E`` ints each) plus the rank among this device's assignments.
    ``ids [T_loc, k]`` int32 -> the same with dropped slots -1.
    """
    flat = ids.reshape(-1)  # token-major: rank within an expert follows token order
    rank, counts = rank_in_group(flat, config.num_experts)
    all_counts = jax.lax.all_gather(counts, token_axes)  # [D, E]
    me = jax.lax.axis_index(token_axes)
    offset = (jnp.cumsum(all_counts, axis=0) - all_counts)[me]  # earlier devices' counts [E]
    keep = offset[flat] + rank < config.capacity(tokens_global)
    return jnp.where(keep, flat, DROPPED).reshape(ids.shape).astype(jnp.int32)


def dispatch_indices(ids: jax.Array, ep: int, experts_local: int, rows: int):
    """Where each token goes: per destination, its buffer row and which slots travel.

    Returns ``dest_of_slot [T, k]`` (destination device, -1 for dropped slots),
    ``sent [T, EP]`` bool, ``row [T, EP]`` int32 (buffer row, valid where sent),
    ``source_token [EP, R]`` int32 (token of each buffer row, ``T`` for padding) and
    ``overflow`` (int32 slots that did not fit; 0 whenever ``rows`` is the safe size).
    """
    T, k = ids.shape
    valid = ids >= 0
    dest_of_slot = jnp.where(valid, ids // experts_local, -1)  # [T, k]
    devices = jnp.arange(ep, dtype=jnp.int32)
    goes = (dest_of_slot[:, :, None] == devices[None, None, :]).any(1)  # [T, EP]
    row = jnp.cumsum(goes, axis=0, dtype=jnp.int32) - 1  # token order within a destination
    sent = goes & (row < rows)
    overflow = jnp.sum(
        (dest_of_slot[:, :, None] == devices[None, None, :])
        & (goes & ~sent)[:, None, :]
    ).astype(jnp.int32)
    tokens = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[:, None], (T, ep))
    dests = jnp.broadcast_to(devices[None, :], (T, ep))
    source_token = jnp.full((ep, rows), T, jnp.int32).at[
        jnp.where(sent, dests, ep), jnp.where(sent, row, rows)
    ].set(tokens, mode="drop")
    return dest_of_slot, sent, row, source_token, overflow


def sum_home_rows(buffer: jax.Array, row: jax.Array, sent: jax.Array) -> jax.Array:
    """``[T, ...]`` float32: for each token the sum, over destinations ``d = 0..EP-1`` in
    ascending order, of its row ``row[t, d]`` of ``buffer [EP, R, ...]`` where ``sent[t, d]``.
    The fixed-order per-token reduction of the combine (and of the packing gather's transpose).

    Where the CUDA extension is built, ``[EP, R, H]`` buffers of 16-byte rows lower on CUDA to
    the ``mok_home_sum`` kernel (the same float32 adds in the same order, 16-byte loads: bitwise
    equal; XLA's gather-add fusion took 0.42-0.48 ms for S1 / 8192's ``[T, H]`` on 2 x H200, and
    with the kernel B4's forward went from 2.44 to 2.02 ms); everything else, and every other
    platform, to :func:`home_sum_xla`.
    """
    if home_sum_kernel_applies(buffer):
        home_row = jnp.where(sent, row, -1).astype(jnp.int32)
        return jax.lax.platform_dependent(
            buffer, home_row, cuda=targets.home_sum,
            default=lambda b, h: home_sum_xla(b, row, sent))
    return home_sum_xla(buffer, row, sent)


def home_sum_kernel_applies(buffer: jax.Array) -> bool:
    """Whether :func:`sum_home_rows` lowers to ``mok_home_sum`` on CUDA: a ``[EP, R, H]``
    buffer of bfloat16 / float32 rows of whole 16-byte vectors, with the CUDA extension built
    and not a GPU it does not run on (:func:`_ffi.cuda_device_limits`: the reference's combine
    takes this path too)."""
    if buffer.ndim != 3 or not _ffi.kernels_built("cuda") or _ffi.cuda_device_limits():
        return False
    per_vector = {jnp.dtype(jnp.bfloat16): 8, jnp.dtype(jnp.float32): 4}.get(buffer.dtype)
    return per_vector is not None and buffer.shape[2] % per_vector == 0


def home_sum_xla(buffer: jax.Array, row: jax.Array, sent: jax.Array) -> jax.Array:
    """:func:`sum_home_rows` as EP whole-row gathers added in turn (``((0 + b_0) + b_1) + ...``,
    the order of the peer combine kernel) rather than one ``[T, EP, ...]`` gather reduced over
    its middle axis: the same sums (bitwise; for EP = 2 any order is this one), and XLA fuses
    row gathers and adds into one pass, where the middle-axis reduction of a gather ran as a slow
    reduce fusion (0.67 ms of B4's 2.74-ms forward on S1 / 8192, 2 x H200)."""
    ep, rows = buffer.shape[0], buffer.shape[1]
    index = jnp.clip(row, 0, rows - 1)
    total = None
    for d in range(ep):
        picked = buffer[d][index[:, d]].astype(jnp.float32)  # [T, ...]
        mask = sent[:, d].reshape(sent.shape[:1] + (1,) * (picked.ndim - 1))
        term = jnp.where(mask, picked, 0.0)
        total = (0.0 + term) if total is None else total + term  # 0 + b_0: as the kernel does
    return total


def gather_rows(values: jax.Array, token_of_row: jax.Array, padding: jax.Array) -> jax.Array:
    """``values[token_of_row]`` (``[T, ...]`` → ``[EP, R, ...]``), zero on padding rows."""
    picked = values[token_of_row]  # [EP, R, ...]
    mask = padding.reshape(padding.shape + (1,) * (picked.ndim - padding.ndim))
    return jnp.where(mask, jnp.zeros((), values.dtype), picked)


@jax.custom_vjp
def home_sum(buffer: jax.Array, row: jax.Array, sent: jax.Array, token_of_row: jax.Array,
             padding: jax.Array) -> jax.Array:
    """:func:`sum_home_rows` with its transpose written as a gather: row ``(d, i)`` of the
    buffer feeds exactly one token (``token_of_row[d, i]``, or none on padding), so the cotangent
    of the buffer is that token's cotangent — what autodiff's scatter-add computes (bitwise: one
    term per row), without the scatter (0.24-0.32 ms per scatter fusion on S1 / 8192's training
    step, 2 x H200)."""
    return sum_home_rows(buffer, row, sent)


def _home_sum_fwd(buffer, row, sent, token_of_row, padding):
    # A zero-size slice carries the buffer's dtype and (inside shard_map) its vma type.
    like = buffer.reshape(-1)[:0]
    return sum_home_rows(buffer, row, sent), (token_of_row, padding, like)


def _home_sum_bwd(residuals, ct):
    token_of_row, padding, like = residuals
    grad = gather_rows(ct, token_of_row, padding).astype(like.dtype)
    return vma.cotangent_like(grad, like), None, None, None, None


home_sum.defvjp(_home_sum_fwd, _home_sum_bwd)


@jax.custom_vjp
def pack_rows(values: jax.Array, token_of_row: jax.Array, padding: jax.Array, row: jax.Array,
              sent: jax.Array) -> jax.Array:
    """``values[token_of_row]`` (``[T, ...]`` → ``[EP, R, ...]``), zero on padding rows.

    The transpose of a gather is a scatter-add, which XLA's GPU backend runs with atomics: a
    token sent to several devices would then get its ``dx`` summed in a varying order (seen on
    2 x H200: 1-ulp bf16 differences between identical calls). This one
    gathers back instead: the cotangent of token ``t`` is :func:`sum_home_rows` of the buffer's
    cotangent, rounded once — deterministic by construction.
    """
    return _pack_rows_fwd(values, token_of_row, padding, row, sent)[0]


def _pack_rows_fwd(values, token_of_row, padding, row, sent):
    like = values.reshape(-1)[:0]  # values' dtype and vma type
    return gather_rows(values, token_of_row, padding), (row, sent, like)


def _pack_rows_bwd(residuals, ct):
    row, sent, like = residuals  # [T, EP] each
    grad = sum_home_rows(ct, row, sent).astype(like.dtype)
    return vma.cotangent_like(grad, like), None, None, None, None


pack_rows.defvjp(_pack_rows_fwd, _pack_rows_bwd)


class Packed(NamedTuple):
    """One device's send buffers and the indices that bring the results home.

    ``x [EP, R, H]`` (x's dtype, zero on padding rows), ``ids [EP, R, k]`` int32 (local expert
    ids at the destination, -1 for slots that do not go there), ``weights [EP, R, k]`` float32
    (0 where ids is -1), ``row [T, EP]`` int32 (the row of token ``t`` in chunk ``d``, valid where
    ``sent``), ``sent [T, EP]`` bool, ``source_token [EP, R]`` int32 (``T`` on padding rows).
    """

    x: jax.Array
    ids: jax.Array
    weights: jax.Array
    row: jax.Array
    sent: jax.Array
    source_token: jax.Array

    @property
    def home_row(self) -> jax.Array:
        """``[T, EP]`` int32: ``row`` where sent, else -1."""
        return jnp.where(self.sent, self.row, -1)

    @property
    def token_of_row(self) -> jax.Array:
        """``[EP, R]`` int32: ``source_token`` with padding rows reading token ``T - 1``."""
        return jnp.minimum(self.source_token, self.row.shape[0] - 1)

    @property
    def padding(self) -> jax.Array:
        """``[EP, R]`` bool: rows that carry no token."""
        return self.source_token >= self.row.shape[0]


def pack(x: jax.Array, ids: jax.Array, weights: jax.Array, ep: int, experts_local: int,
         rows: int) -> tuple[Packed, jax.Array]:
    """Packs ``x [T, H]`` with its routing (``ids [T, k]`` int32 global expert ids, -1 dropped;
    ``weights [T, k]`` float32) for the ``ep`` devices of ``experts_local`` experts each, in
    chunks of ``rows``. Returns the buffers and ``overflow`` (int32 slots that did not fit).
    The gathers are differentiable through :func:`pack_rows`: their transposes sum in a fixed
    order."""
    dest_of_slot, sent, row, source_token, overflow = dispatch_indices(ids, ep, experts_local,
                                                                       rows)
    T = x.shape[0]
    devices = jnp.arange(ep, dtype=jnp.int32)
    token_of_row = jnp.minimum(source_token, T - 1)  # padding reads token T-1, masked below
    padding = source_token >= T  # [EP, R]
    slot_dest = dest_of_slot[token_of_row]  # [EP, R, k]
    mine = (slot_dest == devices[:, None, None]) & ~padding[:, :, None]
    send_ids = jnp.where(mine, ids[token_of_row] % experts_local, DROPPED)
    send_w = jnp.where(mine, pack_rows(weights, token_of_row, padding, row, sent), 0.0)
    send_x = pack_rows(x, token_of_row, padding, row, sent)
    return Packed(send_x, send_ids, send_w, row, sent, source_token), overflow


__all__ = [
    "Packed",
    "buffer_rows",
    "dispatch_indices",
    "gather_rows",
    "global_capacity",
    "home_sum",
    "home_sum_xla",
    "pack",
    "pack_rows",
    "sum_home_rows",
]
