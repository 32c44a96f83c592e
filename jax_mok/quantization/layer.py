"""The FP8 layer: routed experts with every GEMM operand quantized, as a ``jax.custom_vjp``.

This pure-JAX implementation is the semantics of ``MoEConfig(quantization=...)``: it is the CPU
backend and the oracle of the CUDA kernels, which implement the same function up to the float32
summation order inside a GEMM.

Notation: ``Q(t)`` is the recipe's activation quantizer along t's last axis (mxfp8 1 x 32,
fp8_block 1 x 128, :mod:`jax_mok.quantization`); ``Qw(w, axis)`` the weight quantizer (mxfp8 1 x
32 along the GEMM's reduction ``axis``; fp8_block 128 x 128 tiles over an expert's two dims);
``Qt`` the token quantizer of the weight gradients (mxfp8 32 x 1, fp8_block 128 x 1 blocks of
consecutive rows of one expert); ``deq`` dequantizes to float32. Every GEMM accumulates in
float32 (``Precision.HIGHEST``). Rows are the assignments in expert-sorted order: a stable sort by
expert id of the flattened token-major ``topk_ids``, ids outside ``[0, E)`` (capacity drops)
skipped, as in :func:`jax_mok.reference.routed_experts`. ``x``, ``dy`` are quantized from their
values in x's dtype; array weights from their values in the dtype given (``jax_mok.moe`` passes
them in x's dtype).

Forward (y in x's dtype)::

    h   = deq(Q(x))[rows] @ deq(Qw(w_gate_up, H))[e]            [N, 2F] float32
    a   = silu(h[:, :F]) * h[:, F:]                               float32, not rounded
    out = deq(Q(a)) @ deq(Qw(w_down, F))[e]                       [N, H]
    y   = sum_j w_j * out_j   (float32, over k in slot order)

Backward (dy in x's dtype; h recomputed and rounded to x's dtype, as the kernels store it)::

    g   = deq(Q(dy))[rows] @ deq(Qw(w_down, H))[e]^T              [N, F]
    s = sigmoid(hg); silu = hg * s; a = silu * hu                 float32 from the rounded h
    d_w = sum_f g * a;  da = w * g
    dh  = [da * hu * s * (1 + hg * (1 - s)) | da * silu]          rounded to x's dtype
    aw  = w * a                                                   rounded to x's dtype
    dx  = sum_j (deq(Q(dh)) @ deq(Qw(w_gate_up, 2F))[e]^T)_j      float32 sum -> x's dtype
    dW_down[e]    = deq(Qt(aw))^T @ deq(Qt(dy[rows]))             in w_down's dtype
    dW_gate_up[e] = deq(Qt(x[rows]))^T @ deq(Qt(dh))              in w_gate_up's dtype
    d_topk_weights = d_w (float32)

With ``weight_grads="unquantized"`` (``MoEConfig.fp8_weight_gradients``) the two weight gradients
take their operands as they are, in x's dtype (aw and dh as rounded above), with no ``Qt``::

    dW_down[e]    = aw^T @ dy[rows];   dW_gate_up[e] = x[rows]^T @ dh

``Q(dh)`` blocks run along the whole ``2F`` row (gate and up halves together), as do
``Qw(w_gate_up, 2F)``'s. For fp8_block the 128 x 128 tiles of ``Qw(w, H)`` and ``Qw(w, F)`` are the
same tiles. Residuals are the operands; the backward recomputes h. Pre-quantized weights
(:class:`jax_mok.quantization.QuantizedWeight`) hold the forward operands only: the layer runs
forward with them and refuses to differentiate.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jax_mok.quantization import blocks
from jax_mok.quantization import format as fmt
from jax_mok.quantization.blocks import QuantizedWeight

_HIGHEST = jax.lax.Precision.HIGHEST
_TOKEN_BLOCK = {"mxfp8": fmt.MX_BLOCK, "fp8_block": fmt.BLOCK}
WEIGHT_GRADS = ("fp8", "unquantized")


def check_weight_grads(weight_grads: str) -> None:
    if weight_grads not in WEIGHT_GRADS:
        raise ValueError(f"weight_grads (MoEConfig.fp8_weight_gradients) must be one of "
                         f"{WEIGHT_GRADS}, got {weight_grads!r}")


# --- operands ---------------------------------------------------------------------------------

def activation_operand(t: jax.Array, recipe: str) -> jax.Array:
    """``deq(Q(t))`` along the last axis, float32 of t's shape."""
    return blocks.fake_quantize(t, recipe, -1)


def weight_operand(w, recipe: str, reduction_axis: int) -> jax.Array:
    """``deq(Qw(w, reduction_axis))`` in w's logical layout, float32. ``w``: an array (quantized
    here) or a :class:`QuantizedWeight` (its own reduction axis must be ``reduction_axis``)."""
    if isinstance(w, QuantizedWeight):
        if w.reduction_axis != reduction_axis % len(w.shape):
            raise ValueError(f"QuantizedWeight reduced along axis {w.reduction_axis}, needed along "
                             f"axis {reduction_axis}")
        return w.dequantize()
    return QuantizedWeight.quantize(w, recipe, reduction_axis).dequantize()


def prepared_operand(w, recipe: str, reduction_axis: int, form: str) -> jax.Array:
    """A prepared layout's operand: ``form="bf16"`` layouts hold deq(Q(w)) already (float32 of
    them), ``"fp8"`` ones are :class:`QuantizedWeight` (:func:`weight_operand`)."""
    return fmt.to_float32(w) if form == "bf16" else weight_operand(w, recipe, reduction_axis)


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """Expert-sorted rows. ``order [N]``: assignment (token-major ``t * k + j``) of each sorted
    row; ``token [N]``: its token; ``expert [N]``: its expert (``E`` for skipped ids, sorted
    last); ``valid [N]``; ``group_sizes [E]`` int32."""

    order: jax.Array
    token: jax.Array
    expert: jax.Array
    valid: jax.Array
    group_sizes: jax.Array


def dispatch(topk_ids: jax.Array, num_experts: int) -> Dispatch:
    """The expert-sorted order of ``topk_ids [T, k]``: a stable sort of the token-major
    assignments by expert id, ids outside ``[0, num_experts)`` last (skipped)."""
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1)
    key = jnp.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    order = jnp.argsort(key, stable=True)
    group_sizes = jnp.bincount(key, length=num_experts + 1)[:num_experts].astype(jnp.int32)
    expert = key[order]
    return Dispatch(order, order // k, expert, expert < num_experts, group_sizes)


def token_segments(d: Dispatch, block: int) -> tuple[jax.Array, int]:
    """``(segment [N] int32, count)``: the token block of each sorted row for ``Qt``. Blocks are
    ``block`` consecutive rows of one expert (the last one partial), numbered in row order; skipped
    rows go to a last, separate segment. ``count = N // block + E + 1`` bounds the blocks."""
    n, experts = d.expert.shape[0], d.group_sizes.shape[0]
    count = n // block + experts + 1
    starts = jnp.cumsum(d.group_sizes) - d.group_sizes
    e = jnp.minimum(d.expert, experts - 1)
    rank = jnp.arange(n, dtype=jnp.int32) - starts[e]
    blocks = (d.group_sizes + block - 1) // block
    first = jnp.cumsum(blocks) - blocks
    segment = jnp.where(d.valid, first[e] + rank // block, count - 1)
    return segment.astype(jnp.int32), count


def token_block_operand(t: jax.Array, segment: jax.Array, count: int, valid: jax.Array,
                        recipe: str) -> jax.Array:
    """``deq(Qt(t))`` for sorted rows ``t [N, C]``: one scale per (token block, column); rows
    that are not ``valid`` are zeros."""
    x32 = jnp.where(valid[:, None], fmt.to_float32(t), 0.0)
    amax_bits = jax.ops.segment_max(fmt.abs_bits(x32), segment, count,
                                    indices_are_sorted=True)  # [count, C]
    return fmt.fake_quantize_with_amax(x32, amax_bits[segment], recipe)


# --- GEMMs ------------------------------------------------------------------------------------

def grouped_matmul(rows: jax.Array, weights: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """``rows [N, K] @ weights[e] [E, K, M]`` per expert group, float32; rows past the groups 0."""
    return jax.lax.ragged_dot(rows, weights, group_sizes, precision=_HIGHEST,
                              preferred_element_type=jnp.float32)


_WGRAD_DIMS = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[])


def grouped_wgrad(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """``[E, A, B]``: ``lhs[rows of e]^T @ rhs[rows of e]`` for ``lhs [N, A]``, ``rhs [N, B]``."""
    return jax.lax.ragged_dot_general(lhs, rhs, group_sizes, _WGRAD_DIMS, precision=_HIGHEST,
                                      preferred_element_type=jnp.float32)


def _combine(rows: jax.Array, d: Dispatch, tokens: int, k: int) -> jax.Array:
    """Sorted rows ``[N, C]`` -> ``[T, C]`` float32: each token's k rows summed in slot order."""
    rows = jnp.where(d.valid[:, None], rows, 0.0)
    unsorted = jnp.zeros_like(rows).at[d.order].set(rows)
    return unsorted.reshape(tokens, k, -1).sum(1)


# --- the phases -------------------------------------------------------------------------------

def forward_phases(x2d, topk_ids, topk_weights, w_gate_up_q, w_down_q, recipe: str) -> dict:
    """The forward with its operands: ``x_rows`` (``deq(Q(x))[rows]``), ``h``, ``a``, ``a_q``,
    ``out``, ``y``. ``w_*_q``: the forward weight operands ``deq(Qw(w_gate_up, H))``
    ``[E, H, 2F]`` and ``deq(Qw(w_down, F))`` ``[E, F, H]``, float32."""
    tokens, k = topk_ids.shape
    E, F = w_down_q.shape[0], w_down_q.shape[1]
    d = dispatch(topk_ids, E)
    x_rows = activation_operand(x2d, recipe)[d.token]
    h = grouped_matmul(x_rows, w_gate_up_q, d.group_sizes)
    a = jax.nn.silu(h[:, :F]) * h[:, F:]
    a_q = activation_operand(a, recipe)
    out = grouped_matmul(a_q, w_down_q, d.group_sizes)
    w_rows = jnp.where(d.valid, topk_weights.reshape(-1)[d.order], 0.0)
    y = _combine(out * w_rows[:, None], d, tokens, k).astype(x2d.dtype)
    return dict(x_rows=x_rows, h=h, a=a, a_q=a_q, out=out, y=y)


def backward_phases(dy, x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe: str,
                    prepared=None, weight_grads: str = "fp8") -> dict:
    """The backward with its operands (names as in the module docstring; ``*_q`` are dequantized
    GEMM operands, ``*_t`` token-quantized ones). Returns also ``dx``, ``d_topk_weights``,
    ``d_w_gate_up``, ``d_w_down``."""
    dtype = x2d.dtype
    tokens, k = topk_ids.shape
    E, F = w_down.shape[0], w_down.shape[1]
    d = dispatch(topk_ids, E)
    # The weights' operands: quantized here, or the layouts ``prepared`` (an Fp8Weights) holds.
    gu_h, dn_h, gu_2f = ((w_gate_up, w_down, w_gate_up) if prepared is None else
                         (prepared.gate_up, prepared.down_t, prepared.gate_up_t))
    operand = functools.partial(prepared_operand, recipe=recipe,
                                form="fp8" if prepared is None else prepared.form)
    w_gate_up_h = operand(gu_h, reduction_axis=1)
    w_down_h = operand(dn_h, reduction_axis=2)
    # fp8_block quantizes both orientations with the same 128 x 128 tiles.
    w_gate_up_2f = w_gate_up_h if recipe == "fp8_block" else operand(gu_2f, reduction_axis=2)
    x_rows = activation_operand(x2d, recipe)[d.token]
    h = grouped_matmul(x_rows, w_gate_up_h, d.group_sizes)
    h = fmt.to_float32(h.astype(dtype))  # the forward's h as the kernels keep it
    dy_q = activation_operand(dy.astype(dtype), recipe)[d.token]
    g = grouped_matmul(dy_q, jnp.swapaxes(w_down_h, 1, 2), d.group_sizes)  # [N, F]
    g = jnp.where(d.valid[:, None], g, 0.0)
    hg, hu = h[:, :F], h[:, F:]
    s = jax.nn.sigmoid(hg)
    silu = hg * s
    a = silu * hu
    w_rows = jnp.where(d.valid, topk_weights.reshape(-1)[d.order], 0.0)[:, None]
    d_w = jnp.sum(g * a, axis=-1)
    da = w_rows * g
    dh = jnp.concatenate([da * hu * s * (1.0 + hg * (1.0 - s)), da * silu], -1).astype(dtype)
    aw = (w_rows * a).astype(dtype)
    dh_q = activation_operand(dh, recipe)
    dx_rows = grouped_matmul(dh_q, jnp.swapaxes(w_gate_up_2f, 1, 2), d.group_sizes)
    dx = _combine(dx_rows, d, tokens, k).astype(dtype)
    d_topk = jnp.zeros((tokens * k,), jnp.float32).at[d.order].set(
        jnp.where(d.valid, d_w, 0.0)).reshape(tokens, k)
    if weight_grads == "unquantized":
        def t_quant(t):  # the rows as they are, in x's dtype (padding rows zero)
            return jnp.where(d.valid[:, None], fmt.to_float32(t), 0.0)
    else:
        segment, count = token_segments(d, _TOKEN_BLOCK[recipe])
        t_quant = functools.partial(token_block_operand, segment=segment, count=count,
                                    valid=d.valid, recipe=recipe)
    aw_t, dy_t = t_quant(aw), t_quant(dy.astype(dtype)[d.token])
    x_t, dh_t = t_quant(x2d[d.token]), t_quant(dh)
    d_w_down = grouped_wgrad(aw_t, dy_t, d.group_sizes).astype(w_down.dtype)
    d_w_gate_up = grouped_wgrad(x_t, dh_t, d.group_sizes).astype(w_gate_up.dtype)
    return dict(x_rows=x_rows, h=h, dy_q=dy_q, w_down_h=w_down_h, g=g, d_w=d_w, dh=dh, aw=aw,
                dh_q=dh_q, w_gate_up_2f=w_gate_up_2f, dx_rows=dx_rows, aw_t=aw_t, dy_t=dy_t,
                x_t=x_t, dh_t=dh_t, dx=dx, d_topk_weights=d_topk, d_w_gate_up=d_w_gate_up,
                d_w_down=d_w_down)


# --- batching: fold a batch of tokens, else one call per example -------------------------------

def _map_over_batch(fn, axis_size, in_batched, args):
    """``fn`` per example (``lax.map``), unbatched arguments shared by every example."""
    batched = [a for a, b in zip(args, in_batched, strict=True) if b]

    def one(xs):
        it = iter(xs)
        return fn(*(next(it) if b else a for a, b in zip(args, in_batched, strict=True)))

    return jax.lax.map(one, batched)


@functools.cache
def _forward_call(recipe: str):
    @jax.custom_batching.custom_vmap
    def forward(x2d, topk_ids, topk_weights, w_gate_up_q, w_down_q):
        return forward_phases(x2d, topk_ids, topk_weights, w_gate_up_q, w_down_q, recipe)["y"]

    @forward.def_vmap
    def forward_vmap(axis_size, in_batched, x2d, topk_ids, topk_weights, w_gate_up_q, w_down_q):
        args = (x2d, topk_ids, topk_weights, w_gate_up_q, w_down_q)
        if in_batched[3] or in_batched[4]:
            return _map_over_batch(forward, axis_size, in_batched, args), True

        def fold(a, b):  # every row is independent in the forward: the batch joins the tokens
            a = a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
            return a.reshape(-1, *a.shape[2:])

        y = forward(*(fold(a, b) for a, b in zip(args[:3], in_batched[:3], strict=True)),
                    w_gate_up_q, w_down_q)
        return y.reshape(axis_size, x2d.shape[-2], -1), True

    return forward


@functools.cache
def _backward_call(recipe: str, weight_grads: str = "fp8"):
    @jax.custom_batching.custom_vmap
    def backward(dy, x2d, topk_ids, topk_weights, w_gate_up, w_down):
        p = backward_phases(dy, x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe,
                            weight_grads=weight_grads)
        return p["dx"], p["d_topk_weights"], p["d_w_gate_up"], p["d_w_down"]

    @backward.def_vmap
    def backward_vmap(axis_size, in_batched, *args):
        # Weight gradients are per example under vmap: one backward per example.
        return _map_over_batch(backward, axis_size, in_batched, args), (True,) * 4

    return backward


# --- the differentiable layer -----------------------------------------------------------------

def _forward(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe, weight_grads="fp8"):
    del weight_grads  # the backward's only
    return _forward_call(recipe)(x2d, topk_ids, topk_weights, weight_operand(w_gate_up, recipe, 1),
                                 weight_operand(w_down, recipe, 1))


_experts = jax.custom_vjp(_forward, nondiff_argnums=(5, 6))


def _experts_fwd(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe, weight_grads):
    y = _forward(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe)
    return y, (x2d, topk_ids, topk_weights, w_gate_up, w_down)


def _experts_bwd(recipe, weight_grads, residuals, dy):
    topk_weights = residuals[2]
    dx, d_topk, d_gate_up, d_down = _backward_call(recipe, weight_grads)(dy, *residuals)
    return dx, None, d_topk.astype(topk_weights.dtype), d_gate_up, d_down


_experts.defvjp(_experts_fwd, _experts_bwd)

# Prepared weights (jax_mok.fp8_weights): the array weights are the differentiated inputs, the
# prepared layouts replace their quantization and get no cotangent.
@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _experts_prepared(x2d, topk_ids, topk_weights, w_gate_up, w_down, prepared, recipe,
                      weight_grads="fp8"):
    del w_gate_up, w_down, weight_grads
    return _forward_call(recipe)(x2d, topk_ids, topk_weights,
                                 prepared_operand(prepared.gate_up, recipe, 1, prepared.form),
                                 prepared_operand(prepared.down, recipe, 1, prepared.form))


def _prepared_fwd(x2d, topk_ids, topk_weights, w_gate_up, w_down, prepared, recipe,
                  weight_grads):
    prepared.require_backward()
    y = _experts_prepared(x2d, topk_ids, topk_weights, w_gate_up, w_down, prepared, recipe)
    return y, (x2d, topk_ids, topk_weights, w_gate_up, w_down, prepared)


def _prepared_bwd(recipe, weight_grads, residuals, dy):
    x2d, topk_ids, topk_weights, w_gate_up, w_down, prepared = residuals
    p = backward_phases(dy, x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe, prepared,
                        weight_grads)
    return (p["dx"], None, p["d_topk_weights"].astype(topk_weights.dtype), p["d_w_gate_up"],
            p["d_w_down"], None)


_experts_prepared.defvjp(_prepared_fwd, _prepared_bwd)

_PREQUANTIZED_GRAD = (
    "jax_mok: cannot differentiate the FP8 layer with pre-quantized expert weights "
    "(QuantizedWeight, from quantize_params): they hold the forward layout only, and the "
    "backward needs the weights quantized along other axes. Train with array weights (the layer "
    "quantizes them itself) and use quantize_params for inference"
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _experts_prequantized(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe):
    return _forward_call(recipe)(x2d, topk_ids, topk_weights, w_gate_up.dequantize(),
                                 w_down.dequantize())


def _prequantized_fwd(*args):
    raise TypeError(_PREQUANTIZED_GRAD)


def _prequantized_bwd(*args):
    raise TypeError(_PREQUANTIZED_GRAD)


_experts_prequantized.defvjp(_prequantized_fwd, _prequantized_bwd)


def routed_experts_fp8(x2d: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array, w_gate_up,
                       w_down, recipe: str, prepared=None,
                       weight_grads: str = "fp8") -> jax.Array:
    """The routed experts of the FP8 layer (module docstring): ``y [T, H]`` in x's dtype.

    Args:
      x2d: ``[T, H]`` float tokens. topk_ids: ``[T, k]`` int32 (ids outside ``[0, E)``
        skipped). topk_weights: ``[T, k]`` float32 (differentiable).
      w_gate_up: ``[E, H, 2F]`` array or a :class:`QuantizedWeight` along H (forward only).
      w_down: ``[E, F, H]`` array or a :class:`QuantizedWeight` along F (forward only).
      recipe: ``"mxfp8"`` or ``"fp8_block"``.
      prepared: an ``Fp8Weights`` of the same (array) weights (``jax_mok.fp8_weights``): its
        layouts are read instead of quantizing the weights; values and gradients are the same.
      weight_grads: ``"fp8"`` (the weight gradients' operands quantized along tokens) or
        ``"unquantized"`` (in x's dtype; module docstring).

    This is the pure-JAX layer (the CPU path and the oracle);
    :func:`jax_mok.quantization.cuda.routed_experts_fp8` routes a call to the CUDA kernels where
    they run it.
    """
    fmt.check_recipe(recipe)
    check_weight_grads(weight_grads)
    if x2d.ndim != 2 or not jnp.issubdtype(x2d.dtype, jnp.floating):
        raise ValueError(f"x2d must be a [T, H] float array, got shape {tuple(x2d.shape)} "
                         f"dtype {x2d.dtype}")
    tokens, hidden = x2d.shape
    if topk_ids.ndim != 2 or topk_ids.shape[0] != tokens or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids and topk_weights must both be [T={tokens}, k], got "
                         f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
    blocks.check_weights(w_gate_up, w_down, recipe)
    E, H, two_f = w_gate_up.shape
    if H != hidden or two_f % 2 or tuple(w_down.shape) != (E, two_f // 2, hidden):
        raise ValueError(f"expected w_gate_up [E, H={hidden}, 2F] and w_down [E, F, H], got "
                         f"{tuple(w_gate_up.shape)} and {tuple(w_down.shape)}")
    if prepared is not None:
        if isinstance(w_gate_up, QuantizedWeight):
            raise TypeError("fp8_weights need array expert weights in params, not QuantizedWeights")
        return _experts_prepared(x2d, topk_ids, topk_weights, w_gate_up, w_down, prepared, recipe,
                                 weight_grads)
    if isinstance(w_gate_up, QuantizedWeight):
        return _experts_prequantized(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe)
    return _experts(x2d, topk_ids, topk_weights, w_gate_up, w_down, recipe, weight_grads)


__all__ = ["routed_experts_fp8"]
