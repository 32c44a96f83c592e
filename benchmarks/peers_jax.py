"""The JAX implementations: jax_mok (FFI kernels, bf16), its FP8 rows (``jax_mok-<recipe>``,
``jax_mok-<recipe>-prep`` and ``jax_mok-<recipe>-pq``), B1 (jax_mok.reference, ragged_dot) and
B2 (XLA dense: sort by expert, pad every expert to the max count, batched einsum).

Each is a function ``(x [T, H], ids [T, k], topk_weights [T, k], w_gate_up, w_down) -> y [T, H]``;
:func:`forward_fn` / :func:`forward_backward_fn` jit its forward or its forward+backward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

import jax_mok
from benchmarks import mok_internals
from benchmarks.impls import IMPLS
from jax_mok import reference

JAX_IMPLS = tuple(name for name, impl in IMPLS.items() if impl.family == "jax")
# Pre-quantization works on groups of experts so that its float32 temporaries stay near this
# size (S4's w_gate_up is 34 GB in bf16; a float32 copy of it would not fit beside it).
PREQUANTIZE_CHUNK_BYTES = 1 << 30


def dense_padded_experts(x: jax.Array, ids: jax.Array, topk_weights: jax.Array,
                         w_gate_up: jax.Array, w_down: jax.Array, *, capacity: int) -> jax.Array:
    """B2: routed experts as two batched einsums over ``[E, capacity, ...]`` padded buffers
    (:func:`jax_mok.reference.routed_experts_padded`). The harness passes the actual maximum
    expert count, computed on the host before jit: a static bound a real model could not know, so
    B2 gets its best case."""
    return reference.routed_experts_padded(x, ids, topk_weights, w_gate_up, w_down, capacity)


def b2_capacity(max_count: int) -> int:
    """B2's padded expert size: the actual max count rounded up to a multiple of 8 (>= 8)."""
    return max(8, -(-max_count // 8) * 8)


def routed_fn(impl: str, *, capacity: int | None = None) -> Callable:
    """The routed-experts function of a JAX implementation name."""
    if impl not in JAX_IMPLS:
        raise ValueError(f"unknown JAX implementation {impl!r}; expected one of {JAX_IMPLS}")
    spec = IMPLS[impl]
    if spec.precision == "fp8":
        return mok_internals.routed_experts_fp8(spec.recipe, "ffi")
    if impl == "jax_mok":
        return mok_internals.routed_experts_bf16("ffi")
    if impl == "B1":
        return mok_internals.routed_experts_bf16("reference")
    if capacity is None:
        raise ValueError("B2 needs capacity (the padded expert size)")
    return functools.partial(dense_padded_experts, capacity=capacity)


def forward_fn(fn: Callable, prepared: bool = False):
    """jit of ``(x, ids, w, w_gate_up, w_down, dy) -> y``; dy is ignored (uniform signature).
    ``prepared``: the program takes ``jax_mok.fp8_weights``' layouts after ``w_down`` and passes
    them to ``fn`` as ``prepared``."""
    if prepared:
        return jax.jit(lambda x, ids, tw, gu, d, prep, dy: fn(x, ids, tw, gu, d, prepared=prep))
    return jax.jit(lambda x, ids, tw, gu, d, dy: fn(x, ids, tw, gu, d))


def forward_backward_fn(fn: Callable, prepared: bool = False):
    """jit of ``(x, ids, w, w_gate_up, w_down, dy) -> (y, (dx, d_w, d_w_gate_up, d_w_down))``.

    The vjp with the random cotangent ``dy``: the gradients of ``sum(y * dy)`` w.r.t. x, the
    routing weights and both expert weights, and y itself (a training step needs both).
    ``prepared``: as in :func:`forward_fn`; the layouts get no cotangent (the weight gradients
    are the master weights').
    """

    def grads(x, ids, tw, w_gate_up, w_down, dy, **extra):
        y, vjp = jax.vjp(lambda x, tw, a, b: fn(x, ids, tw, a, b, **extra), x, tw, w_gate_up,
                         w_down)
        return y, vjp(dy)

    if prepared:
        return jax.jit(lambda x, ids, tw, gu, d, prep, dy: grads(x, ids, tw, gu, d, dy,
                                                                 prepared=prep))
    return jax.jit(grads)


def _experts_per_chunk(w_gate_up: jax.Array) -> int:
    """The largest divisor of E whose float32 gate/up slice stays under the chunk budget."""
    E, H, two_f = w_gate_up.shape
    fit = max(1, PREQUANTIZE_CHUNK_BYTES // (H * two_f * 4))
    return max(d for d in range(1, min(E, fit) + 1) if E % d == 0)


def _expert_params(w_gate_up: jax.Array, w_down: jax.Array,
                   quantization: str | None = None) -> jax_mok.MoEParams:
    """``jax_mok.MoEParams`` around bare expert weights (a zero router, no shared expert): what
    the weight-quantizing API functions take."""
    E, H, two_f = w_gate_up.shape
    config = jax_mok.MoEConfig(num_experts=E, top_k=1, hidden_size=H, ffn_size=two_f // 2,
                               quantization=quantization)
    return jax_mok.MoEParams(router=jnp.zeros((H, E), jnp.float32), router_bias=None,
                             w_gate_up=w_gate_up, w_down=w_down, shared_gate_up=None,
                             shared_down=None, config=config)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _prequantize(w_gate_up: jax.Array, w_down: jax.Array, recipe: str, per_chunk: int):
    E, H, two_f = w_gate_up.shape
    F = two_f // 2

    def chunk(ws):
        quantized = jax_mok.quantize_params(_expert_params(*ws), recipe)
        return quantized.w_gate_up, quantized.w_down

    n = E // per_chunk
    stacked = jax.lax.map(chunk, (w_gate_up.reshape(n, per_chunk, H, two_f),
                                  w_down.reshape(n, per_chunk, F, H)))
    # [n, per_chunk, ...] leaves -> [E, ...]: the experts in order, reduction axis still 1
    return jax.tree.map(lambda a: a.reshape(E, *a.shape[2:]), stacked)


def prequantize(w_gate_up: jax.Array, w_down: jax.Array, recipe: str):
    """``(w_gate_up, w_down)`` as ``jax_mok.QuantizedWeight`` s, exactly what
    ``jax_mok.quantize_params`` makes of them (it quantizes each expert on its own, so groups of
    experts at a time give the same bits)."""
    return _prequantize(w_gate_up, w_down, recipe, _experts_per_chunk(w_gate_up))


@functools.partial(jax.jit, static_argnums=(2,))
def prepare(w_gate_up: jax.Array, w_down: jax.Array, recipe: str):
    """``jax_mok.fp8_weights`` of ``(w_gate_up, w_down)`` for ``recipe``: every FP8 layout the
    layer reads, forward and backward, made by the layer's own quantizer (the CUDA one where the
    FP8 kernels run)."""
    return jax_mok.fp8_weights(_expert_params(w_gate_up, w_down, recipe))


def quantized_bytes_per_expert(weights) -> float:
    """Bytes the layer reads per expert from pre-quantized ``(w_gate_up, w_down)``: FP8 values
    and their scales."""
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(weights))
    return total / weights[0].values.shape[0]


def bf16_bytes_per_expert(shape, dtype) -> float:
    """Bytes of one expert's ``w_gate_up`` and ``w_down`` in ``dtype``."""
    return 3 * shape.hidden * shape.ffn * jnp.dtype(dtype).itemsize


def fp8_path(lowered, platform: str) -> tuple[str, str | None]:
    """``(path, reason)`` of a lowered program: "kernels" when it calls the FP8 custom calls,
    else "pure-jax" with, on a GPU, the reason the row is not jax_mok's kernels (None on the
    CPU, whose FP8 backend is the pure-JAX layer by design)."""
    targets = mok_internals.fp8_kernel_targets(lowered.as_text())
    if targets:
        return "kernels: " + ", ".join(targets), None
    if platform == "cpu":
        return "pure-jax (the FP8 layer's CPU backend)", None
    return "pure-jax", ("the FP8 layer lowered to plain XLA operations (no mok_*fp8 custom "
                        "call): the FP8 CUDA kernels are not wired into jax_mok here, so this "
                        "row would time the pure-JAX definition, not jax_mok's kernels "
                        "(JAX_MOK_BENCH_FP8_PURE_JAX=1 times it anyway)")

