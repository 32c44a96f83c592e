"""The roofline of one record: the least time the H200 allows for what the layer must do.

    roofline = max(routed FLOPs / matmul ceiling, bytes that must move / HBM copy bandwidth)

with both ceilings measured in the same run (``ceilings.py``): the bf16 matmul ceiling for bf16
rows, the FP8 one for FP8 rows. Bytes that must move (``T`` tokens, hidden ``H``, ``b`` bytes per
element of x; ``W_read`` the bytes of the touched experts' weights in the dtype the
implementation reads — bf16, or FP8 values + scales for pre-quantized rows; ``W_grad`` the bytes
of all E experts' weight gradients, dense outputs in the weights' dtype):

    forward:          W_read + 2·T·H·b (x read, y written) + 8·T·k (ids and weights read)
    forward+backward: 2·W_read + W_grad + 4·T·H·b (x and dy read, y and dx written)
                      + 12·T·k (ids and weights read, their gradient written, 4 bytes each)

A touched expert is one with at least one routed token (mean over the input sets). The copy
bandwidth counts read + write, so a pass that only streams weights in (S5) can beat this bound
slightly: % of roofline above 100 % means the bound, not the kernel, is off.
"""

from __future__ import annotations


def ceiling_tflops(record: dict, ceilings: dict) -> float | None:
    """The measured matmul ceiling (TFLOP/s) of the record's precision: FP8 for FP8 rows, else
    bf16; None when it was not measured."""
    return ceilings.get("fp8_matmul_tflops" if record.get("precision") == "fp8"
                        else "matmul_tflops")


def moved_bytes(record: dict) -> float:
    """Bytes that must move for one record (module docstring). Needs the record's ``pass``,
    ``tokens``, ``hidden``, ``top_k``, ``experts``, ``x_itemsize``, ``experts_touched``,
    ``weight_bytes_per_expert`` and, for forward+backward, ``weight_grad_bytes_per_expert``."""
    tokens_bytes = record["tokens"] * record["hidden"] * record["x_itemsize"]
    routing_elements = record["tokens"] * record["top_k"]
    weights = record["experts_touched"] * record["weight_bytes_per_expert"]
    if record["pass"] == "fwd":
        return weights + 2 * tokens_bytes + 8 * routing_elements
    grads = record["experts"] * record["weight_grad_bytes_per_expert"]
    return 2 * weights + grads + 4 * tokens_bytes + 12 * routing_elements


def roofline(record: dict, ceilings: dict) -> dict | None:
    """``{"roofline_ms", "roofline_bound", "moved_bytes", "ceiling_tflops"}`` for an "ok"
    record, or None when a ceiling it needs was not measured. ``roofline_bound`` is "compute"
    or "memory": which term is larger."""
    tflops = ceiling_tflops(record, ceilings)
    gbps = ceilings.get("hbm_gbps")
    if not tflops or not gbps:
        return None
    moved = moved_bytes(record)
    compute_ms = record["flops"] / (tflops * 1e12) * 1e3
    memory_ms = moved / (gbps * 1e9) * 1e3
    return {
        "roofline_ms": max(compute_ms, memory_ms),
        "roofline_bound": "compute" if compute_ms >= memory_ms else "memory",
        "moved_bytes": moved,
        "ceiling_tflops": tflops,
    }
