"""Expert-parallel timing hook (issue 5): transport "xla" (B4) vs "peer" on one host's GPUs.

    python3 tools/ep_bench.py --out OUT/ep.jsonl [--shapes S1,S2] [--tokens 4096,8192,16384]

Per (shape, tokens per GPU, routing): forward and forward+backward median ms of ``jax_mok.moe``
on a 1-D ``("expert",)`` mesh over every local GPU, per transport; plus the exchange alone
(``peer.dispatch`` vs ``lax.all_to_all`` of the same ``[EP, R, H]`` rows) with GB/s per direction.
Experts are scaled down (``--expert-scale``) when the weights would not fit; the record says so.
Also the compute alone (``compute_only_*``: one GPU, E/ep experts, no exchange) for the overlap
figure layer / max(compute-only, communication-only). Configs run token-major (the first token
count for every shape first); ``--budget-s`` records what is left as skipped.
Status: run on 2 x H200 on 2026-11-29 (BENCHMARKS.md, expert-parallel table).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mok
from benchmarks import problems
from jax_mok import peer, sharding, testing, workspace
from jax_mok.routing import route

_REPS = 10


def _median_ms(fn, *args) -> float:
    reps = _REPS
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def _exchange_ms(mesh, ep: int, rows: int, hidden: int, k: int, ws: int) -> dict:
    """The dispatch exchange alone: peer kernel vs XLA all_to_all, same bytes."""
    spec = P("expert")
    x = jax.device_put(jnp.ones((ep * ep, rows, hidden), jnp.bfloat16), NamedSharding(mesh, spec))
    ids = jax.device_put(jnp.zeros((ep * ep, rows, k), jnp.int32), NamedSharding(mesh, spec))
    w = jax.device_put(jnp.zeros((ep * ep, rows, k), jnp.float32), NamedSharding(mesh, spec))

    def peer_fn(a, b, c):
        return peer.dispatch(a, b, c, ws)

    def xla_fn(a, b, c):
        return tuple(jax.lax.all_to_all(v, "expert", 0, 0, tiled=True) for v in (a, b, c))

    out = {}
    for name, fn in (("peer", peer_fn), ("xla", xla_fn)):
        mapped = jax.jit(sharding._shard_map(fn, mesh, (spec,) * 3, (spec,) * 3))
        out[name] = _median_ms(mapped, x, ids, w)
    sent = (ep - 1) * rows * (hidden * 2 + 8 * k)  # bytes each GPU sends off-device
    out["bytes_per_direction"] = sent
    out.update({f"{n}_GBps": sent / (out[n] * 1e-3) / 1e9 for n in ("peer", "xla")})
    return out


def _compute_only_ms(config, tokens: int, ep: int, device) -> dict:
    """The expert compute one GPU does in EP, alone: the same kernels on one device with
    ``E / ep`` experts and the same ``tokens`` and ``k`` (balanced routing gives each GPU
    ``tokens * k`` assignments on average), no exchange. The denominator of the overlap figure
    together with the exchange time."""
    local = dataclasses.replace(config, num_experts=max(config.top_k, config.num_experts // ep))
    with jax.default_device(device):
        params = jax_mok.init_params(jax.random.key(2), local)
        x = jax.random.normal(jax.random.key(3), (tokens, config.hidden_size), jnp.bfloat16)
        fwd = jax.jit(lambda x, p: jax_mok.moe(x, p))
        grad = jax.jit(
            jax.grad(lambda x, p: jnp.sum(jax_mok.moe(x, p).astype(jnp.float32)), argnums=(0, 1))
        )
        out = {
            "compute_only_fwd_ms": _median_ms(fwd, x, params),
            "compute_only_fwd_bwd_ms": _median_ms(grad, x, params),
        }
    del params, x
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="S1,S2")
    ap.add_argument("--tokens", default="4096,8192,16384")
    ap.add_argument(
        "--expert-scale",
        type=int,
        default=1,
        help="divide E by this (S2's 256 experts are 22.5 GB in bf16)",
    )
    ap.add_argument("--platform", default="gpu", help="cpu: a dry run of this script (xla only)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument(
        "--budget-s",
        type=float,
        default=1e9,
        help="record the configs left as skipped once this many seconds have passed",
    )
    args = ap.parse_args()
    global _REPS
    _REPS = args.reps
    gpus = jax.devices(args.platform)
    mesh = jax.sharding.Mesh(np.array(gpus), ("expert",))
    ep = len(gpus)
    ok, reason = workspace.peer_transport_available(mesh, "expert")
    print(f"EP={ep} peer available: {ok} ({reason})", flush=True)
    transports = ("xla", "peer") if ok else ("xla",)

    def programs_for(t):
        def layer(x, p):
            return jax_mok.moe(x, p, mesh=mesh, transport=t)

        def loss(x, p):
            return jnp.sum(layer(x, p).astype(jnp.float32))

        return jax.jit(layer), jax.jit(jax.grad(loss, argnums=(0, 1)))

    # One jitted program pair per transport: balanced and skewed share shapes and compile once.
    programs = {t: programs_for(t) for t in transports}
    from benchmarks.run import git_commit

    commit = git_commit()
    t_start = time.perf_counter()
    configs = [(name, int(t)) for t in args.tokens.split(",") for name in args.shapes.split(",")]
    params_cache: dict = {}
    with open(args.out, "a") as sink:

        def emit(record: dict) -> None:  # flushed: a `timeout` kill must not lose records
            print(json.dumps(record), flush=True)
            sink.write(json.dumps(record) + "\n")
            sink.flush()

        for name, tokens in configs:  # token-major: the first token count covers every shape
            shape = testing.SHAPES[name]
            experts = max(ep, shape.experts // args.expert_scale)
            config = dataclasses.replace(shape.config(), num_experts=experts)
            if name not in params_cache:
                params_cache.clear()  # one shape's weights at a time
                params = jax_mok.init_params(jax.random.key(0), config)
                experts_sharding = NamedSharding(mesh, P("expert"))
                params_cache[name] = dataclasses.replace(
                    params,
                    w_gate_up=jax.device_put(params.w_gate_up, experts_sharding),
                    w_down=jax.device_put(params.w_down, experts_sharding),
                )
            params = params_cache[name]
            for routing in ("balanced", "skewed"):
                record = {
                    "shape": name,
                    "experts": experts,
                    "scaled": experts != shape.experts,
                    "tokens_per_gpu": tokens,
                    "ep": ep,
                    "routing": routing,
                    "commit": commit,
                }
                elapsed = time.perf_counter() - t_start
                if elapsed > args.budget_s:
                    record["skipped"] = f"--budget-s {args.budget_s:.0f} used up"
                    emit(record)
                    continue
                p = params
                if routing == "skewed":  # the first E/4 experts' logits scaled x3
                    p = dataclasses.replace(p, router=p.router.at[:, : experts // 4].mul(3.0))
                x = jax.device_put(
                    jax.random.normal(jax.random.key(1), (ep * tokens, shape.hidden), jnp.bfloat16),
                    NamedSharding(mesh, P("expert")),
                )
                # The routing this config measures, comparable with B5's (benchmarks.ep_torch):
                # the share of assignments that go to the hot 10 % of the experts.
                ids = route(x, p.router, p.router_bias, config)[0].topk_ids
                record["hot_share"] = problems.hot_share(np.asarray(ids), experts)
                for transport, (fwd, grad) in programs.items():
                    try:
                        record[f"{transport}_fwd_ms"] = _median_ms(fwd, x, p)
                        record[f"{transport}_fwd_bwd_ms"] = _median_ms(grad, x, p)
                    except Exception as e:  # record and go on: one failure must not end it
                        record[f"{transport}_error"] = str(e)[:500]
                if routing == "balanced":
                    try:
                        record.update(_compute_only_ms(config, tokens, ep, gpus[0]))
                    except Exception as e:
                        record["compute_only_error"] = str(e)[:300]
                if ok and routing == "balanced":
                    spec = workspace.WorkspaceSpec.for_call(
                        config, tokens, ep * tokens, ep, jnp.bfloat16
                    )
                    ws = workspace.workspace_for(mesh, "expert", spec, config)
                    record["exchange"] = _exchange_ms(
                        mesh, ep, spec.rows, shape.hidden, shape.top_k, ws
                    )
                emit(record)


if __name__ == "__main__":
    main()
