"""Bandwidth of the peer exchange alone, against XLA's all_to_all, over chunk sizes.

    python3 tools/peer_bw.py --out OUT/bw.jsonl [--sizes 2048x4096,2048x8192,...] [--inner 10]

One record per size ``HxR`` (hidden x rows per (source, destination) chunk, bf16, k = 8): the
in-program time of one staged dispatch exchange (``peer.dispatch``: push into the peer, flag,
wait, copy out) and of ``lax.all_to_all`` on the same ``[EP, R, H]`` rows, ``[EP, R, k]`` ids
and weights, with GB/s per direction (``tools/ep_bench.py``'s ``_exchange_ms``). The exchange's
tuning comes from ``JAX_MOK_TUNING`` (``copy``: copy engines, the default, or ``sm`` stores;
``ctas_per_sm``; ``check``); ``tools/gpu_check_ep.sh bw`` runs this script once per setting and
every record names the tuning fields it set.

Why: on 2 x H200 (BENCHMARKS.md) the exchange ran at 75-95 GB/s in-program for chunks up to
34 MB and at 50-150 GB/s above ~60 MB (S1 at 16384 tokens: 49.5 GB/s), where plain remote stores
reach 369 GB/s in one direction (../shared/DEVICE.md). The default sizes bracket that step.
"""

from __future__ import annotations

import argparse
import json
import time

import ep_bench  # tools/ is on sys.path when this script runs
import jax
import numpy as np

from jax_mok import tuning
from jax_mok.ep import workspace

DEFAULT_SIZES = "2048x4096,2048x8192,2048x12288,2048x16384,7168x2048,7168x4096,7168x8192"


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"HxR,HxR"`` -> ``[(H, R), ...]``, with an error naming the bad entry."""
    out = []
    for item in text.split(","):
        try:
            h, r = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--sizes: {item!r} is not HxR (e.g. 2048x8192)") from None
        if h <= 0 or r <= 0 or h % 8:
            raise SystemExit(f"--sizes: {item!r} needs H > 0, a multiple of 8, and R > 0")
        out.append((h, r))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="HxR chunks, comma-separated")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    sizes = parse_sizes(args.sizes)
    ep_bench._REPS, ep_bench._INNER = args.reps, max(1, args.inner)
    gpus = jax.devices("gpu")
    mesh = jax.sharding.Mesh(np.array(gpus), ("expert",))
    ep = len(gpus)
    ok, reason = workspace.peer_transport_available(mesh, "expert")
    if not ok:
        raise SystemExit(f"peer transport not available: {reason}")
    knobs = dict(sorted((tuning.read("JAX_MOK_TUNING") or {}).items()))
    limit = tuning.resolve().peer.workspace_limit_bytes
    t0 = time.time()
    with open(args.out, "a") as f:
        for hidden, rows in sizes:
            spec = workspace.WorkspaceSpec(ep, rows, hidden, args.top_k, "bfloat16")
            ws = workspace.workspace_for(mesh, "expert", spec, limit_bytes=limit)
            rec = {"hidden": hidden, "rows": rows, "ep": ep, "top_k": args.top_k,
                   "inner": args.inner, "knobs": knobs,
                   "commit": tuning.read("JAX_MOK_GIT_COMMIT") or "unknown"}
            rec.update(ep_bench._exchange_ms(mesh, ep, rows, hidden, args.top_k, ws))
            f.write(json.dumps(rec) + "\n")
            f.flush()
            mb = rec["bytes_per_direction"] / 1e6
            print(f"[{time.time() - t0:6.1f}s] H={hidden} R={rows} ({mb:.0f} MB/direction) "
                  f"peer {rec['peer_ms']:.3f} ms ({rec['peer_GBps']:.0f} GB/s), "
                  f"all_to_all {rec['xla_ms']:.3f} ms ({rec['xla_GBps']:.0f} GB/s) {knobs}",
                  flush=True)
            workspace.reset()  # one workspace at a time: the largest is ~2 GB per GPU


if __name__ == "__main__":
    main()
