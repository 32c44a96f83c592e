"""The implementations the harness times: names, families, precision, passes, check tolerances.

One table so that the orchestrator, the workers and the report agree on what a name means.
``jax_mok`` rows are ours; every other row is a peer. Precision "fp8" rows are measured against
the FP8 matmul ceiling and compared with the FP8 peers; "bf16" rows (x's dtype) against the bf16
ceiling and the bf16 peers.
"""

from __future__ import annotations

import dataclasses

# FP8 rows are not held to the BF16 bound. E4M3 keeps 3 mantissa bits: each quantized operand
# is off by ~2.7 % RMS (half an ulp of 2^-4, spread over the mantissa), a GEMM of two such
# operands by ~3.8 %, and y, which passes through two GEMMs and the SwiGLU product of two
# gate/up outputs, by ~6-7 % on random normal inputs (measured on the CPU for both recipes: y
# 6.2 % fp8_block, 7.0 % mxfp8; gradients 5.8-8.2 %), as the FP8 layer's own tests found. Issue
# 13's 5e-2 is therefore a target reported beside each FP8 row (FP8_ACCURACY_TARGET), while the
# check that decides whether a row is timed uses 0.1 (--fp8-tolerance): a wrong kernel is off
# by O(1), so this still separates right from wrong. The routing-weight gradient, a sum over F
# of products of two quantized factors whose terms cancel, gets half as much again (measured
# 8.2 % for mxfp8 on the CPU smoke shape, 0.1 would leave too thin a margin).
FP8_TOLERANCE = 0.1
FP8_ROUTER_GRAD_FACTOR = 1.5
FP8_ACCURACY_TARGET = 5e-2
_OUTPUTS = ("y", "dx", "d_topk_weights", "d_w_gate_up", "d_w_down")
# Liger-Kernel adds the routing-weight gradient dS across the F tiles with bfloat16 atomics
# (``dS = torch.zeros(TK, dtype=dO.dtype)``): up to F/64 roundings of a sum whose terms cancel,
# which can exceed the 1e-2 BF16 bound on that one output; its other outputs keep 1e-2.
LIGER_DS_TOLERANCE = 5e-2


@dataclasses.dataclass(frozen=True)
class Impl:
    """``family``: "jax" (jax_mok, B1, B2), "torch" (B3, B3-fp8) or "liger" (B6).
    ``precision``: "bf16" (the GEMMs in x's dtype) or "fp8"; ``recipe``: the FP8 recipe of a
    jax_mok FP8 row; ``prequantized``: weights quantized once outside the timed call
    (``jax_mok.quantize_params``, inference); ``prepared``: bf16 master weights plus their FP8
    layouts made once outside the timed call by ``jax_mok.fp8_weights`` (a micro-batch of a
    step that quantizes its weights once: gradients still reach the master weights).
    ``tolerance``: per probed output, overriding ``testing.tolerance(dtype)`` (FP8 rows:
    :func:`tolerances`)."""

    name: str
    family: str
    precision: str = "bf16"
    recipe: str | None = None
    prequantized: bool = False
    passes: tuple[str, ...] = ("fwd", "fwdbwd")
    tolerance: dict | None = None
    description: str = ""
    prepared: bool = False

    @property
    def peer(self) -> bool:
        return not self.name.startswith("jax_mok")


IMPLS: dict[str, Impl] = {i.name: i for i in (
    Impl("jax_mok", "jax", description="jax_mok's kernels, bf16"),
    Impl("jax_mok-fp8_block", "jax", "fp8", "fp8_block",
         description="FP8 128-block recipe, weights quantized inside the layer from bf16"),
    Impl("jax_mok-mxfp8", "jax", "fp8", "mxfp8",
         description="MXFP8 recipe, weights quantized inside the layer from bf16"),
    Impl("jax_mok-fp8_block-pq", "jax", "fp8", "fp8_block", True, ("fwd",),
         description="FP8 128-block, weights pre-quantized by jax_mok.quantize_params"),
    Impl("jax_mok-mxfp8-pq", "jax", "fp8", "mxfp8", True, ("fwd",),
         description="MXFP8, weights pre-quantized by jax_mok.quantize_params"),
    Impl("jax_mok-fp8_block-prep", "jax", "fp8", "fp8_block", prepared=True,
         description="FP8 128-block, weight layouts from jax_mok.fp8_weights made once outside "
                     "the timed call (the cost of a micro-batch)"),
    Impl("jax_mok-mxfp8-prep", "jax", "fp8", "mxfp8", prepared=True,
         description="MXFP8, weight layouts from jax_mok.fp8_weights made once outside the timed "
                     "call (the cost of a micro-batch)"),
    Impl("B1", "jax", description="jax_mok.reference: sort + XLA ragged_dot"),
    Impl("B2", "jax", description="XLA dense: sort, pad every expert to the max count, einsum"),
    Impl("B3", "torch", description="PyTorch: gather, torch._grouped_mm, SwiGLU, index_add_"),
    Impl("B3-fp8", "torch", "fp8",
         description="B3 with torch._scaled_grouped_mm, row-wise E4M3 scales"),
    Impl("B6", "liger", tolerance={"d_topk_weights": LIGER_DS_TOLERANCE},
         description="Liger-Kernel Triton fused MoE (LigerFusedMoEFunction)"),
)}

# Run order inside a (routing, pass) group: torch first while JAX's memory pool is still small,
# then ours, then the XLA peers; the report's column order follows this tuple too.
RUN_ORDER = ("B3", "B3-fp8", "jax_mok", "jax_mok-fp8_block", "jax_mok-mxfp8",
             "jax_mok-fp8_block-prep", "jax_mok-mxfp8-prep", "jax_mok-fp8_block-pq",
             "jax_mok-mxfp8-pq", "B6", "B2", "B1")
assert set(RUN_ORDER) == set(IMPLS)
# Run after every group of a shape, in this order (worker.shape_items): B6, whose first call
# runs Liger's autotune for minutes where benchmarks/b6_configs.json has no record of the shape
# (an item timeout then kills the worker and the shape's budget with it, which must not cost
# the rows the run is for); B1, slow and often out of memory.
RUN_LAST = ("B6", "B1")

GROUPS = {
    "all": RUN_ORDER,
    "bf16": ("jax_mok", "B1", "B2", "B3", "B6"),
    "fp8": ("jax_mok-fp8_block", "jax_mok-mxfp8", "jax_mok-fp8_block-prep", "jax_mok-mxfp8-prep",
            "jax_mok-fp8_block-pq", "jax_mok-mxfp8-pq", "B3-fp8"),
    "peers": tuple(n for n in RUN_ORDER if IMPLS[n].peer),
}


def expand(names: list[str]) -> list[str]:
    """Implementation names with group names ("all", "bf16", "fp8", "peers") expanded, in the
    order given, each once. Unknown names raise ValueError naming them."""
    out: list[str] = []
    for name in names:
        members = GROUPS.get(name, (name,))
        unknown = [m for m in members if m not in IMPLS]
        if unknown:
            raise ValueError(f"unknown implementation {unknown[0]!r}; expected names from "
                             f"{list(RUN_ORDER)} or groups {list(GROUPS)}")
        out += [m for m in members if m not in out]
    return out


def tolerances(name: str, fp8_tolerance: float = FP8_TOLERANCE) -> dict | None:
    """The check bounds of ``name`` per probed output (None: ``testing.tolerance(dtype)`` for
    every output); FP8 rows get ``fp8_tolerance`` on every output, ``d_topk_weights``
    ``FP8_ROUTER_GRAD_FACTOR`` times that."""
    impl = IMPLS[name]
    if impl.precision == "fp8":
        bounds = dict.fromkeys(_OUTPUTS, fp8_tolerance)
        bounds["d_topk_weights"] = FP8_ROUTER_GRAD_FACTOR * fp8_tolerance
        return bounds
    return impl.tolerance


def runs_pass(name: str, passname: str) -> bool:
    return passname in IMPLS[name].passes
