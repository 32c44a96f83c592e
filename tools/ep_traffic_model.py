"""Traffic-and-time model of the expert-parallel exchanges (docs/peer-transport.md, "Traffic and
time model"): bytes each rank sends per direction for one layer call, the link time at NVLink 4
and NVLink 5 bandwidths, and the check against the EP = 2 measurements of BENCHMARKS.md.

    python3 tools/ep_traffic_model.py

Per (source, destination) chunk of ``rows`` rows the exchanges carry (b = bytes of x's dtype):
dispatch x rows + int32 ids + float32 weights ``rows * (H*b + 8k)``; combine rows ``rows * H*b``
(x's dtype); backward: dy rows ``rows * H*b`` out, dx rows + float32 d_topk_weights
``rows * (H*b + 4k)`` back. A rank sends one chunk to each of the ``EP - 1`` other ranks (its own
chunk stays on the device). ``rows = T`` today (jax_mok.ep.pack.buffer_rows, dropless); routed
rows only: the expected number of this rank's tokens with a slot on the destination,
``T * routed_fraction``.
"""

from __future__ import annotations

from math import comb

# Shapes of ../shared/BENCHMARKS.md (the EP runs keep 8192 tokens per GPU): H, k, E.
SHAPES = {"S1": (2048, 8, 128), "S2": (7168, 8, 256)}
TOKENS = 8192
BF16 = 2
NVLINK4_GBPS = 396.0  # cudaMemcpyPeerAsync one way on 2 x H200 (../shared/DEVICE.md); 450 nominal
NVLINK5_GBPS = 900.0  # NVLink 5 nominal per direction (NVL72); nothing measured here
# One staged dispatch exchange alone, in-program, 2 x H200, copy engines (BENCHMARKS.md, 47419cf
# call 4; S1 / 8192 from calls 4-overlap and 5: call 4's 0.503 ms is the noisy one it names).
MEASURED_EP2_MS = {("S1", 4096): 0.196, ("S2", 4096): 0.371, ("S1", 8192): 0.2515,
                   ("S2", 8192): 0.829, ("S1", 16384): 0.388, ("S2", 16384): 1.038}
# The fused layer's forward and the same expert compute alone, ms (BENCHMARKS.md, 47419cf call 4):
# their difference is the forward's two exchanges plus whatever of them is not hidden.
MEASURED_EP2_LAYER_MS = {("S1", 8192): (1.964, 1.438), ("S2", 8192): (13.579, 11.709),
                         ("S1", 16384): (3.869, 2.697), ("S2", 16384): (25.666, 23.171)}


def routed_fraction(ep: int, k: int, experts: int | None = None) -> float:
    """Probability that a token's ``k`` distinct experts include one of a given rank's
    ``E / ep``, under balanced (uniform) routing: ``1 - C(E - E/ep, k) / C(E, k)``; without
    ``experts``, the with-replacement approximation ``1 - (1 - 1/ep)^k``."""
    if experts is None:
        return 1.0 - (1.0 - 1.0 / ep) ** k
    return 1.0 - comb(experts - experts // ep, k) / comb(experts, k)


def chunk_bytes(rows: float, hidden: int, k: int, itemsize: int = BF16) -> dict:
    """Bytes of one (source, destination) chunk of each exchange of a training step."""
    row = hidden * itemsize
    return {"dispatch": rows * (row + 8 * k), "combine": rows * row,
            "reverse_combine": rows * row, "reverse_dispatch": rows * (row + 4 * k)}


def direction_bytes(ep: int, tokens: int, hidden: int, k: int, experts: int | None = None,
                    routed: bool = False, itemsize: int = BF16) -> dict:
    """Bytes one rank sends (= receives, balanced) per direction: ``forward`` (dispatch +
    combine), ``backward`` (reverse combine + reverse dispatch) and each exchange."""
    rows = tokens * routed_fraction(ep, k, experts) if routed else tokens
    out = {name: (ep - 1) * b for name, b in chunk_bytes(rows, hidden, k, itemsize).items()}
    out["forward"] = out["dispatch"] + out["combine"]
    out["backward"] = out["reverse_combine"] + out["reverse_dispatch"]
    return out


def workspace_bytes(ep: int, tokens: int, hidden: int, k: int, itemsize: int = BF16) -> int:
    """Symmetric workspace per GPU at ``R = T`` (jax_mok.ep.workspace.WorkspaceSpec): a 4096-B
    signal area + 4 areas x EP sources x the dispatch chunk (each field padded to 16 B)."""
    pad = lambda n: -(-n // 16) * 16  # noqa: E731
    return 4096 + 4 * ep * (pad(tokens * hidden * itemsize) + 2 * pad(tokens * k * 4))


def ms(nbytes: float, gbps: float) -> float:
    return nbytes / gbps / 1e6


def table(tokens: int = TOKENS) -> str:
    head = ("| EP | shape | routed rows / T | fwd MB/dir R=T | fwd MB/dir routed | "
            "NVLink 4 fwd ms R=T / routed | NVLink 5 fwd ms R=T / routed | fwd+bwd MB/dir "
            "R=T / routed | workspace GB/GPU |")
    lines = [head, "|" + " --- |" * 9]
    for ep in (2, 4, 8, 64):
        for name, (hidden, k, experts) in SHAPES.items():
            worst = direction_bytes(ep, tokens, hidden, k)
            used = direction_bytes(ep, tokens, hidden, k, experts, routed=True)
            nvl4 = ("–" if ep > 8 else
                    f"{ms(worst['forward'], NVLINK4_GBPS):.2f} / "
                    f"{ms(used['forward'], NVLINK4_GBPS):.2f}")
            step = lambda b: (b["forward"] + b["backward"]) / 1e6  # noqa: E731
            lines.append(
                f"| {ep} | {name} | {routed_fraction(ep, k, experts):.3f} | "
                f"{worst['forward'] / 1e6:.0f} | {used['forward'] / 1e6:.0f} | {nvl4} | "
                f"{ms(worst['forward'], NVLINK5_GBPS):.2f} / "
                f"{ms(used['forward'], NVLINK5_GBPS):.2f} | {step(worst):.0f} / {step(used):.0f} | "
                f"{workspace_bytes(ep, tokens, hidden, k) / 1e9:.1f} |")
    return "\n".join(lines)


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``t = t0 + bytes / bw``: ``(t0 ms, bw GB/s)``."""
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    slope = (sum((b - mx) * (t - my) for b, t in points)
             / sum((b - mx) ** 2 for b, _ in points))
    return my - slope * mx, 1.0 / slope / 1e6


def validation() -> str:
    """The EP = 2 dispatch exchange: bytes sent (R = T, as measured), the link-only prediction
    and the measurement; then the two-parameter fit ``t0 + bytes / bw`` and its residuals."""
    rows, points = [], []
    for (name, tokens), measured in MEASURED_EP2_MS.items():
        hidden, k, _ = SHAPES[name]
        nbytes = direction_bytes(2, tokens, hidden, k)["dispatch"]
        points.append((nbytes, measured))
        rows.append((name, tokens, nbytes, measured))
    t0, bw = fit(points)
    lines = [f"fit: t = {t0:.3f} ms + bytes / {bw:.0f} GB/s",
             "| shape | T | MB/dir | link-only ms @396 | measured ms | measured / link-only | "
             "fit ms | fit error |", "|" + " --- |" * 8]
    for name, tokens, nbytes, measured in rows:
        link = ms(nbytes, NVLINK4_GBPS)
        fitted = t0 + nbytes / bw / 1e6
        lines.append(f"| {name} | {tokens} | {nbytes / 1e6:.1f} | {link:.3f} | {measured:.3f} | "
                     f"{measured / link:.2f}x | {fitted:.3f} | "
                     f"{100 * (fitted - measured) / measured:+.0f} % |")
    lines += ["", "| shape | T | fwd MB/dir | peer fwd - compute-only fwd ms | link-only ms | "
              "fit (2 exchanges) ms |", "|" + " --- |" * 6]
    for (name, tokens), (layer, compute) in MEASURED_EP2_LAYER_MS.items():
        hidden, k, _ = SHAPES[name]
        fwd = direction_bytes(2, tokens, hidden, k)["forward"]
        lines.append(f"| {name} | {tokens} | {fwd / 1e6:.1f} | {layer - compute:.3f} | "
                     f"{ms(fwd, NVLINK4_GBPS):.3f} | {2 * t0 + fwd / bw / 1e6:.3f} |")
    return "\n".join(lines)


def main() -> None:
    print(f"Bytes per direction per rank, one layer call, bf16, {TOKENS} tokens per GPU;")
    print(f"NVLink 4 at {NVLINK4_GBPS:.0f} GB/s, NVLink 5 at {NVLINK5_GBPS:.0f} GB/s per direction")
    print(table())
    print()
    print("EP = 2 dispatch exchange, model vs 2 x H200 (BENCHMARKS.md):")
    print(validation())


if __name__ == "__main__":
    main()
