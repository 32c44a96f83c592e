"""Benchmark problems: shapes, random inputs rotated over several sets, and the reference check.

Inputs live on the default JAX device. Every implementation (JAX or torch) reads the same arrays
(torch through DLPack, without a copy), so a shape's expert weights exist once in device memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_mok import reference, testing
from jax_mok.routing import DROPPED

L2_BYTES = 60 * 2**20  # H200; token-side inputs are always rotated, weights when they are small
ROTATE_WEIGHTS_BELOW_BYTES = 4 * L2_BYTES
HOT_FRACTION = 0.1  # testing.random_routing biases the first 10 % of experts
TARGET_HOT_SHARE = 0.5  # skewed routing: ~50 % of assignments go to the hot 10 % of experts
MEMORY_BOUND_SHAPES = ("S5",)  # reported in ms and as bytes of touched expert weights / time


def scaled_shape(name: str, scale_tokens: float = 1.0, scale_model: float = 1.0) -> testing.Shape:
    """The named shape of ``testing.SHAPES`` with tokens (and optionally H, F) scaled.

    H and F are rounded to multiples of 8 (the kernels' alignment), tokens to at least 1.
    """
    if name not in testing.SHAPES:
        raise ValueError(f"unknown shape {name!r}; expected one of {sorted(testing.SHAPES)}")
    base = testing.SHAPES[name]
    if scale_tokens == 1.0 and scale_model == 1.0:
        return base

    def mult8(v: int) -> int:
        return max(8, int(round(v * scale_model / 8)) * 8)

    return dataclasses.replace(
        base,
        tokens=max(1, int(round(base.tokens * scale_tokens))),
        hidden=mult8(base.hidden),
        ffn=mult8(base.ffn),
    )


def hot_share(ids: np.ndarray, experts: int) -> float:
    """Share of the assignments in ``ids [T, k]`` that went to the hot experts."""
    hot = max(1, int(experts * HOT_FRACTION))
    return float(np.mean(np.asarray(ids) < hot))


def skew_target(experts: int, top_k: int) -> float:
    """The hot share skewed routing aims for: 50 %, or 80 % of the reachable share.

    A token sends at most ``min(hot, k)`` of its k assignments to the hot experts, so when
    ``min(hot, k) / k <= 50 %`` (S3: 1 hot expert of 8, k = 2) 50 % would need every token on
    the hot experts; we then aim at 80 % of that maximum.
    """
    hot = max(1, int(experts * HOT_FRACTION))
    reachable = min(hot, top_k) / top_k
    return min(TARGET_HOT_SHARE, 0.8 * reachable)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _routing(key, tokens: int, experts: int, top_k: int, skew):
    """``testing.random_routing`` under one jit (skew traced: one compilation per shape)."""
    return testing.random_routing(key, tokens, experts, top_k, skew)


@functools.cache
def calibrate_skew(experts: int, top_k: int, sample_tokens: int = 2048) -> float:
    """The ``skew`` of ``testing.random_routing`` that gives ``skew_target`` (bisection)."""
    target = skew_target(experts, top_k)
    key = jax.random.key(1234)
    lo, hi = 0.0, 30.0
    for _ in range(22):
        mid = 0.5 * (lo + hi)
        ids, _ = _routing(key, sample_tokens, experts, top_k, mid)
        if hot_share(np.asarray(ids), experts) < target:
            lo = mid
        else:
            hi = mid
    return round(0.5 * (lo + hi), 3)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _expert_weights(key, dims: tuple, dtype):
    """``(w_gate_up [E, H, 2F], w_down [E, F, H])``, normal with fan-in scaling.

    Generated one expert at a time (``lax.map``) so that float32 temporaries stay at one expert:
    S4's w_gate_up is 34 GB in bf16, and a float32 copy of it would not fit beside it.
    """
    E, H, F = dims

    def one(k):
        k_gu, k_d = jax.random.split(k)
        gate_up = jax.random.normal(k_gu, (H, 2 * F), jnp.float32) / math.sqrt(H)
        down = jax.random.normal(k_d, (F, H), jnp.float32) / math.sqrt(F)
        return gate_up.astype(dtype), down.astype(dtype)

    return jax.lax.map(one, jax.random.split(key, E))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _token_inputs(key, dims: tuple, dtype, skew):
    """``(x [T, H], ids [T, k], topk_weights [T, k], dy [T, H])`` for one input set."""
    T, H, E, k = dims
    k_x, k_r, k_dy = jax.random.split(key, 3)
    ids, topk_weights = testing.random_routing(k_r, T, E, k, skew)
    x = jax.random.normal(k_x, (T, H), jnp.float32).astype(dtype)
    dy = jax.random.normal(k_dy, (T, H), jnp.float32).astype(dtype)
    return x, ids, topk_weights, dy


@dataclasses.dataclass
class InputSet:
    """One set of operands. ``x [T, H]``, ``ids [T, k] int32``, ``weights [T, k] f32``,
    ``w_gate_up [E, H, 2F]``, ``w_down [E, F, H]``, ``dy [T, H]`` (the random cotangent)."""

    x: jax.Array
    ids: jax.Array
    weights: jax.Array
    w_gate_up: jax.Array
    w_down: jax.Array
    dy: jax.Array

    def args(self) -> tuple:
        return (self.x, self.ids, self.weights, self.w_gate_up, self.w_down)


@dataclasses.dataclass
class Problem:
    """A shape with one routing, as ``num_sets`` rotated input sets (+ host-side statistics)."""

    shape: testing.Shape
    routing: str
    skew: float
    dtype: jnp.dtype
    sets: list[InputSet]
    counts: list[np.ndarray]  # per set: [E] assignments per expert
    weights_rotated: bool

    @property
    def max_count(self) -> int:
        return int(max(c.max() for c in self.counts))

    def routing_stats(self) -> dict:
        counts = np.stack(self.counts)
        hot = max(1, int(self.shape.experts * HOT_FRACTION))
        return {
            "skew": self.skew,
            "hot_share": float(counts[:, :hot].sum() / counts.sum()),
            "max_count": int(counts.max()),
            "min_count": int(counts.min()),
            "mean_count": float(counts.mean()),
            "experts_touched": float(np.mean((counts > 0).sum(1))),
        }

    def touched_weight_bytes(self) -> float:
        """Bytes of expert weights the layer must read: experts with >= 1 token, mean over sets."""
        s = self.shape
        per_expert = (s.hidden * 2 * s.ffn + s.ffn * s.hidden) * jnp.dtype(self.dtype).itemsize
        return float(np.mean([(c > 0).sum() for c in self.counts])) * per_expert


def make_problem(shape: testing.Shape, routing: str, *, dtype=jnp.bfloat16, num_sets: int = 3,
                 seed: int = 0, weights: tuple | None = None) -> Problem:
    """Random inputs for ``shape``: ``num_sets`` token-side sets; weights shared unless small.

    ``weights``: reuse ``(w_gate_up, w_down)`` (a shape's balanced and skewed problems share them).
    Never zeros: x, weights and the cotangent are normal, the routing is softmax of random logits.
    """
    if routing not in ("balanced", "skewed"):
        raise ValueError(f"routing must be 'balanced' or 'skewed', got {routing!r}")
    skew = calibrate_skew(shape.experts, shape.top_k) if routing == "skewed" else 0.0
    T, H, F, E, k = shape.tokens, shape.hidden, shape.ffn, shape.experts, shape.top_k
    weight_bytes = E * 3 * H * F * jnp.dtype(dtype).itemsize
    rotate_weights = weight_bytes < ROTATE_WEIGHTS_BELOW_BYTES and weights is None
    key = jax.random.key(seed)
    sets, counts = [], []
    for i in range(num_sets):
        k_tokens, k_weights = jax.random.split(jax.random.fold_in(key, i))
        if weights is not None:
            w_gate_up, w_down = weights
        elif i == 0 or rotate_weights:
            w_gate_up, w_down = _expert_weights(k_weights, (E, H, F), jnp.dtype(dtype))
        x, ids, topk_weights, dy = _token_inputs(k_tokens, (T, H, E, k), jnp.dtype(dtype), skew)
        sets.append(InputSet(x=x, ids=ids, weights=topk_weights, w_gate_up=w_gate_up,
                             w_down=w_down, dy=dy))
        counts.append(np.bincount(np.asarray(ids).reshape(-1), minlength=E))
    return Problem(shape, routing, skew, jnp.dtype(dtype), sets, counts, rotate_weights)


# ----------------------------------------------------------------------------------------------
# The check: a probe of tokens, rows and experts, compared with the float32 reference.


@dataclasses.dataclass
class Probe:
    """What the check compares, chosen at random from set 0.

    The forward of a token depends on that token only, so ``y``, ``dx`` and ``d_topk_weights``
    of the probe tokens, taken from the full-size run, must equal the reference run on those
    tokens alone. For the weight gradients the check run gets a cotangent that is zero outside the
    probe tokens: then ``d_w_*`` hold the probe tokens' contributions only, which the reference
    computes too. They are compared on ``experts`` (up to 4 touched experts, the busiest first)
    and on sampled rows (``h_rows`` of ``d_w_gate_up``, ``f_rows`` of ``d_w_down``), which keeps
    the host copies small at S2/S4 sizes.
    """

    tokens: np.ndarray  # [P] sorted token indices
    experts: np.ndarray  # [Q] expert ids
    h_rows: np.ndarray  # rows of d_w_gate_up[e] (hidden index)
    f_rows: np.ndarray  # rows of d_w_down[e] (ffn index)
    dy_check: jax.Array  # [T, H] the cotangent of set 0, zero outside the probe tokens


def make_probe(problem: Problem, *, num_tokens: int = 48, num_experts: int = 4,
               num_rows: int = 128, seed: int = 7) -> Probe:
    rng = np.random.default_rng(seed)
    s = problem.shape
    tokens = np.sort(rng.choice(s.tokens, size=min(num_tokens, s.tokens), replace=False))
    ids = np.asarray(problem.sets[0].ids)[tokens]
    touched, hits = np.unique(ids, return_counts=True)
    busiest_first = touched[np.argsort(-hits, kind="stable")]
    experts = busiest_first[:num_experts]
    h_rows = np.sort(rng.choice(s.hidden, size=min(num_rows, s.hidden), replace=False))
    f_rows = np.sort(rng.choice(s.ffn, size=min(num_rows, s.ffn), replace=False))
    mask = np.zeros((s.tokens, 1), np.float32)
    mask[tokens] = 1.0
    dy = problem.sets[0].dy
    dy_check = (dy * jnp.asarray(mask, dy.dtype)).astype(dy.dtype)
    return Probe(tokens, experts, h_rows, f_rows, dy_check)


def probe_outputs(probe: Probe, y, grads=None) -> dict[str, np.ndarray]:
    """The probed pieces of JAX outputs as float32 numpy (sliced on the device first).

    ``y [T, H]``; ``grads = (dx [T, H], d_topk_weights [T, k], d_w_gate_up [E, H, 2F],
    d_w_down [E, F, H])`` or None for a forward-only run.
    """
    tok = jnp.asarray(probe.tokens)
    out = {"y": np.asarray(y[tok].astype(jnp.float32))}
    if grads is not None:
        dx, dtw, dgu, dd = grads
        ex = jnp.asarray(probe.experts)
        out["dx"] = np.asarray(dx[tok].astype(jnp.float32))
        out["d_topk_weights"] = np.asarray(dtw[tok].astype(jnp.float32))
        out["d_w_gate_up"] = np.asarray(dgu[ex][:, jnp.asarray(probe.h_rows)].astype(jnp.float32))
        out["d_w_down"] = np.asarray(dd[ex][:, jnp.asarray(probe.f_rows)].astype(jnp.float32))
    return out


def _reference_vjp(x, local_ids, tw, w_gate_up, w_down, dy):
    """Float32 reference value and vjp: ``(y, (dx, d_w, d_w_gate_up, d_w_down))``."""
    y, vjp = jax.vjp(
        lambda x, tw, a, b: reference.routed_experts(x, local_ids, tw, a, b),
        x, tw, w_gate_up, w_down,
    )
    return y, vjp(dy)


@jax.jit
def _reference_token_outputs(s0_args, tok, local_ids, slots):
    """``(y, dx, d_w)`` of tokens ``tok`` seeing experts ``slots`` only (gathers inside the jit,
    one compilation for every chunk; XLA drops the unused weight gradients)."""
    x, _, tw, w_gate_up, w_down, dy = s0_args
    f32 = jnp.float32
    y, (dx, dtw, _, _) = _reference_vjp(
        x[tok].astype(f32), local_ids, tw[tok], w_gate_up[slots].astype(f32),
        w_down[slots].astype(f32), dy[tok].astype(f32))
    return y, dx, dtw


@jax.jit
def _reference_weight_grads(s0_args, tok, local_ids, experts, h_rows, f_rows):
    """Sampled rows of the weight gradients of ``experts`` from the assignments in local_ids."""
    x, _, tw, w_gate_up, w_down, dy = s0_args
    f32 = jnp.float32
    _, (_, _, dgu, dd) = _reference_vjp(
        x[tok].astype(f32), local_ids, tw[tok], w_gate_up[experts].astype(f32),
        w_down[experts].astype(f32), dy[tok].astype(f32))
    return dgu[:, h_rows], dd[:, f_rows]


def reference_probe(problem: Problem, probe: Probe,
                    assignments_per_chunk: int = 32) -> dict[str, np.ndarray]:
    """``jax_mok.reference.routed_experts`` on float32-upcast probe tokens (value + vjp).

    Memory stays small at S2/S4 sizes (where a float32 copy of every touched expert would not
    fit next to the bf16 weights): ``y``, ``dx`` and ``d_topk_weights`` come from chunks of a few
    tokens that see only the experts they touch (ids remapped; padded to a fixed count so one
    compilation serves every chunk); the weight gradients come from one run that keeps only the
    probe tokens' assignments to ``probe.experts`` (the others become DROPPED, which the reference
    skips) and sees only those experts. Both are exact: a token's outputs depend on its own
    assignments only, and ``d_w[e]`` is a sum over the assignments to e.
    """
    s0 = problem.sets[0]
    k = s0.ids.shape[1]
    all_ids = np.asarray(s0.ids)
    tokens = probe.tokens
    per_chunk = max(1, assignments_per_chunk // k)
    padded = np.concatenate([tokens, np.repeat(tokens[-1:], -len(tokens) % per_chunk)])
    ys, dxs, dtws = [], [], []
    args = (s0.x, s0.ids, s0.weights, s0.w_gate_up, s0.w_down, s0.dy)
    with jax.default_matmul_precision("highest"):
        for c in range(0, len(padded), per_chunk):
            tok = padded[c:c + per_chunk]
            ids = all_ids[tok]
            touched = np.unique(ids)
            slots = np.full(per_chunk * k, touched[0])  # fixed expert count per chunk
            slots[:touched.size] = touched
            local_ids = np.searchsorted(touched, ids).astype(np.int32)
            y, dx, dtw = _reference_token_outputs(args, tok, local_ids, slots)
            ys.append(np.asarray(y))
            dxs.append(np.asarray(dx))
            dtws.append(np.asarray(dtw))
        n = len(tokens)
        out = {"y": np.concatenate(ys)[:n], "dx": np.concatenate(dxs)[:n],
               "d_topk_weights": np.concatenate(dtws)[:n]}

        ids = all_ids[tokens]
        local = np.full(ids.shape, DROPPED, np.int32)
        for q, e in enumerate(probe.experts):
            local[ids == e] = q
        dgu, dd = _reference_weight_grads(args, tokens, local, probe.experts, probe.h_rows,
                                          probe.f_rows)
    out["d_w_gate_up"] = np.asarray(dgu)
    out["d_w_down"] = np.asarray(dd)
    return out


def compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray], dtype,
            tolerances: dict[str, float] | None = None) -> dict:
    """Relative Frobenius errors (``testing.rel_error``) of every probed output, and the verdict.

    Each output is held to ``tolerances[name]`` where given (an implementation's documented
    bound, ``impls.py``), else to ``testing.tolerance(dtype)``. ``tolerance`` in the result is
    the largest bound applied, ``tolerances`` every bound by output.
    """
    default = testing.tolerance(dtype)
    errors, bounds = {}, {}
    for name, value in got.items():
        if value.shape != want[name].shape:
            raise ValueError(f"probe {name}: shape {value.shape} vs reference {want[name].shape}")
        errors[name] = testing.rel_error(value, want[name])
        bounds[name] = (tolerances or {}).get(name, default)
    worst = max(errors.values())
    passed = all(np.isfinite(e) and e <= bounds[n] for n, e in errors.items())
    return {"errors": errors, "max_error": worst, "tolerance": max(bounds.values()),
            "tolerances": bounds, "passed": bool(passed)}
