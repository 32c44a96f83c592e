"""Expert-parallel timing hook (issue 5): transport "xla" (B4) vs "peer" on one host's GPUs.

    python3 tools/ep_bench.py --out OUT/ep.jsonl [--shapes S1,S2] [--tokens 4096,8192,16384]
        [--expert-scale 1] [--reps 10] [--inner 20] [--budget-s S] [--platform gpu]
        [--quantization fp8_block|mxfp8]   # FP8 layers: the rows travel packed (values + scales)
    python3 tools/ep_table.py OUT/ep.jsonl [OUT/ep_torch.jsonl]   # the markdown table

Per (shape, tokens per GPU, routing): forward and forward+backward (``jax.grad`` of the sum) of
``jax_mok.moe`` on a 1-D ``("expert",)`` mesh over every local GPU, per transport; plus, for the
balanced routing, the exchange alone (``peer.dispatch`` vs ``lax.all_to_all`` of the same
``[EP, R, H]`` rows, ``[EP, R, k]`` ids and weights) with GB/s per direction, and the compute
alone (``compute_only_*``: one GPU, E/ep experts, the same tokens, no exchange). Experts are
scaled down (``--expert-scale``) when the weights would not fit; the record says so.

Two figures per program, each the median of ``--reps`` timed calls after 2 untimed ones:

- ``*_call_ms``: wall time (perf_counter) of one call of the program, up to
  ``block_until_ready``: includes the host's dispatch (~0.1-0.5 ms). Records without ``inner``
  (older runs) hold only this figure, under the names ``*_ms`` and ``exchange.peer`` / ``.xla``.
- ``*_ms``: wall time of one call of a program running the body ``--inner`` times (a
  ``fori_loop``), divided by ``--inner``: the per-iteration device time plus 1/inner of one
  dispatch. Iteration ``i + 1`` takes an input that XLA must compute from iteration ``i``'s
  output but that keeps its value (layer: ``x + 0 * y``, one elementwise pass over ``[T, H]``,
  ~1 % of a layer; exchange: each operand's first element taken from the previous output, per
  device), and the last output is returned whole: no iteration can be hoisted, merged or dropped,
  and no gradient is dead. (An ``optimization_barrier`` does not do this: XLA removes it, then the
  unused outputs.)

``overlap`` = ``peer_fwd_ms / max(compute_only_fwd_ms, 2 * exchange.peer_ms)`` (``xla_overlap``
with B4 and the all_to_all): a forward exchanges its rows twice (dispatch, then combine; the
combine carries no ids / weights, so ``2 * exchange`` slightly overstates the communication).
1.0 would be communication and compute fully overlapped with no glue (routing, packing, the
combine's reduction); running them one after the other gives about
(compute + 2 * exchange + glue) / max(...). Balanced records only. The glue alone is not measured
(it would need an identity exchange inside ``jax_mok.ep``). Every iteration reads the same
inputs (B5 rotates two token sets so that the L2 cannot hold them).

Configs run token-major (the first token count for every shape first); ``--budget-s`` records
what is left as skipped. Tuning comes from ``JAX_MOK_TUNING`` (e.g. ``copy=sm,check=deferred``);
each record names the fields it sets. Results: BENCHMARKS.md, expert-parallel table.
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
from kernel_timings import median_s  # tools/ is on sys.path when this script runs

import jax_mok
from benchmarks import problems
from jax_mok import testing, tuning
from jax_mok.ep import peer, workspace
from jax_mok.ep.layer import shard_map
from jax_mok.quantization import rows as fp8_rows
from jax_mok.routing import route

_REPS = 10
_INNER = 20


def _median_ms(fn, *args) -> float:
    """Median wall ms of one call of ``fn(*args)`` up to ``block_until_ready``."""
    return 1e3 * median_s(fn, *args, n=_REPS, warmup=2)


def _same_x(x, out):
    """``x + 0 * y`` with ``y`` the output's first leaf (``x``'s shape and sharding): the value
    of ``x``, but XLA cannot tell (floats: ``0 * y`` is not folded). One elementwise pass."""
    return x + 0 * jax.tree.leaves(out)[0]


def _first_elements(xs, outs):
    """Each leaf of ``xs`` with its first element set from the same leaf of ``outs`` (the
    exchange sends constants, so the values stay the same). Per device: inside the shard_map."""
    corner = lambda a: jax.lax.slice(a, (0,) * a.ndim, (1,) * a.ndim)
    return tuple(
        jax.lax.dynamic_update_slice(x, corner(o), (0,) * x.ndim)
        for x, o in zip(xs, outs, strict=True)
    )


def _repeated(body, feedback, n: int):
    """``body(x, *rest)`` ``n`` times in one program (a ``fori_loop``). Call ``i + 1`` takes
    ``feedback(x_i, out_i)``, so it depends on call ``i``'s output and no call can be hoisted,
    merged or dropped; the last output is returned, so none of its leaves (e.g. the weight
    gradients) is dead."""

    def run(x, *rest):
        def step(_, carry):
            x = feedback(*carry)
            return x, body(x, *rest)

        return jax.lax.fori_loop(0, n - 1, step, (x, body(x, *rest)))

    return run


def _programs(body, feedback=_same_x, wrap=lambda f: f) -> tuple:
    """(one call, ``_INNER`` calls in one program) of ``wrap(body)``, jitted once."""
    return jax.jit(wrap(body)), jax.jit(wrap(_repeated(body, feedback, _INNER)))


def _time(out: dict, key: str, programs: tuple, *args) -> None:
    """``out[key + "_call_ms"]`` and ``out[key + "_ms"]`` (per in-program iteration)."""
    once, looped = programs
    out[f"{key}_call_ms"] = _median_ms(once, *args)
    out[f"{key}_ms"] = _median_ms(looped, *args) / _INNER


def _exchange_ms(mesh, ep: int, rows: int, hidden: int, k: int, ws: int | None) -> dict:
    """The dispatch exchange alone: XLA all_to_all and (``ws`` given) the peer kernel, same
    bytes. ``*_GBps`` from the in-program ``*_ms``."""
    spec = P("expert")
    put = lambda a: jax.device_put(a, NamedSharding(mesh, spec))
    x = put(jnp.ones((ep * ep, rows, hidden), jnp.bfloat16))
    ids = put(jnp.zeros((ep * ep, rows, k), jnp.int32))
    w = put(jnp.zeros((ep * ep, rows, k), jnp.float32))

    def xla_fn(abc):
        return tuple(jax.lax.all_to_all(v, "expert", 0, 0, tiled=True) for v in abc)

    def peer_fn(abc):
        return peer.dispatch(*abc, ws, tuning.resolve().peer)

    fns = {"xla": xla_fn} if ws is None else {"peer": peer_fn, "xla": xla_fn}
    sent = (ep - 1) * rows * (hidden * 2 + 8 * k)  # bytes each GPU sends off-device
    out = {"bytes_per_direction": sent}
    wrap = lambda f: shard_map(f, mesh, (spec,), spec)  # the loop runs per device
    for name, fn in fns.items():
        _time(out, name, _programs(fn, _first_elements, wrap), (x, ids, w))
        out[f"{name}_GBps"] = sent / (out[f"{name}_ms"] * 1e-3) / 1e9
    return out


def _loss(layer):
    return jax.grad(lambda x, p: jnp.sum(layer(x, p).astype(jnp.float32)), argnums=(0, 1))


def _compute_only_ms(config, tokens: int, ep: int, device) -> dict:
    """The expert compute one GPU does in EP, alone: the same kernels on one device with
    ``E / ep`` experts and the same ``tokens`` and ``k`` (balanced routing gives each GPU
    ``tokens * k`` assignments on average), no exchange. The denominator of the overlap figure
    together with the exchange time."""
    local = dataclasses.replace(config, num_experts=max(config.top_k, config.num_experts // ep))
    out: dict = {}
    with jax.default_device(device):
        params = jax_mok.init_params(jax.random.key(2), local)
        x = jax.random.normal(jax.random.key(3), (tokens, config.hidden_size), jnp.bfloat16)
        layer = jax_mok.moe
        _time(out, "compute_only_fwd", _programs(layer), x, params)
        _time(out, "compute_only_fwd_bwd", _programs(_loss(layer)), x, params)
    del params, x
    return out


def _overlap(record: dict) -> None:
    """``overlap`` (peer) and ``xla_overlap``: layer fwd / max(compute alone, 2 exchanges)."""
    ex, compute = record.get("exchange", {}), record.get("compute_only_fwd_ms")
    for transport, key in (("peer", "overlap"), ("xla", "xla_overlap")):
        layer, exchange = record.get(f"{transport}_fwd_ms"), ex.get(f"{transport}_ms")
        if layer and compute and exchange:
            record[key] = layer / max(compute, 2 * exchange)


def _skewed(params, scale: float):
    """The router with the columns of the hot 10 % of the experts scaled by ``scale``."""
    hot = max(1, int(params.config.num_experts * problems.HOT_FRACTION))
    return dataclasses.replace(params, router=params.router.at[:, :hot].mul(scale))


def _skew_scale(x, params, config, sample: int = 4096) -> float:
    """The router-column scale that sends ``problems.skew_target`` (~50 %) of the assignments of
    ``sample`` tokens to the hot 10 % of the experts: the protocol's skew, as B5
    (benchmarks.ep_torch) and the single-GPU harness calibrate it with a logit bias — a router
    has no bias term under softmax routing, so the hot columns are scaled instead (bisection)."""
    target = problems.skew_target(config.num_experts, config.top_k)
    xs = jax.device_get(x[:sample])
    lo, hi = 1.0, 30.0
    for _ in range(16):
        mid = 0.5 * (lo + hi)
        p = _skewed(params, mid)
        ids = route(jnp.asarray(xs), jax.device_get(p.router), None, config)[0].topk_ids
        if problems.hot_share(np.asarray(ids), config.num_experts) < target:
            lo = mid
        else:
            hi = mid
    return round(0.5 * (lo + hi), 3)


def _profile(record: dict, programs: dict, x, p) -> None:
    """``record["profile"][transport][pass]``: busy / span and the top XLA ops and kernels of
    GPU 0, ms per call (tools/device_profile.py); the full text goes to stdout."""
    import device_profile  # tools/ is on sys.path when this script runs

    record["profile"] = {}
    for transport, progs in programs.items():
        for what in ("fwd", "fwd_bwd"):
            try:
                summary = device_profile.profile_calls(progs[what][0], x, p, calls=3)
            except Exception as e:
                record["profile"][f"{transport}_{what}"] = {"error": str(e)[:300]}
                continue
            print(f"--- profile {record['shape']} {record['tokens_per_gpu']} {transport} {what}")
            print(device_profile.format_summary(summary), flush=True)
            if summary:
                gpu0 = summary[0]
                record["profile"][f"{transport}_{what}"] = {
                    "device": gpu0["device"],
                    "busy_ms": gpu0["busy_ms"],
                    "span_ms": gpu0["span_ms"],
                    "ops": gpu0["ops"][:15],
                    "kernels": gpu0["kernels"][:15],
                }


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
    ap.add_argument("--reps", type=int, default=10, help="timed calls per figure (median)")
    ap.add_argument(
        "--inner", type=int, default=20, help="iterations per program for the *_ms figures"
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="balanced configs: also trace 3 calls of each transport's layer (fwd, fwd+bwd) and "
        "record where the device time goes (tools/device_profile.py)",
    )
    ap.add_argument(
        "--profile-tokens",
        default=None,
        help="with --profile: only these tokens-per-GPU counts (comma-separated), to save time",
    )
    ap.add_argument(
        "--router-precision",
        default="highest",
        choices=("highest", "high", "default"),
        help="MoEConfig.router_precision of every layer (the router GEMM; B5 has no router)",
    )
    ap.add_argument(
        "--quantization",
        default=None,
        choices=("fp8_block", "mxfp8"),
        help="MoEConfig.quantization of every layer (fp8_weight_gradients='fp8': the rows travel "
        "quantized on both transports); default: bf16",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=1e9,
        help="record the configs left as skipped once this many seconds have passed",
    )
    args = ap.parse_args()
    global _REPS, _INNER
    _REPS, _INNER = args.reps, max(1, args.inner)
    gpus = jax.devices(args.platform)
    mesh = jax.sharding.Mesh(np.array(gpus), ("expert",))
    ep = len(gpus)
    ok, reason = workspace.peer_transport_available(mesh, "expert")
    print(f"EP={ep} peer available: {ok} ({reason})", flush=True)
    transports = ("xla", "peer") if ok else ("xla",)

    def programs_for(t):
        def layer(x, p):  # "peer" by name: "auto" keeps "xla" for FP8 (jax_mok.ep.plan)
            return jax_mok.moe(x, p, mesh=mesh, transport=t)

        return {"fwd": _programs(layer), "fwd_bwd": _programs(_loss(layer))}

    # One jitted program set per transport: balanced and skewed share shapes and compile once.
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
            config = dataclasses.replace(
                shape.config(), num_experts=experts, router_precision=args.router_precision,
                quantization=args.quantization,
                fp8_weight_gradients="fp8" if args.quantization else None)
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
                    "reps": _REPS,
                    "inner": _INNER,
                    "platform": args.platform,
                    # sync (default): each peer call ends in a host sync that reports a timeout
                    # from that call; deferred: reported at the next call (ep_handlers.cu)
                    "peer_check": tuning.resolve().peer.check,
                    "router_precision": args.router_precision,
                    "quantization": args.quantization,
                    # bytes of one row to the experts on either transport (FP8: pack_rows)
                    "row_bytes": (fp8_rows.packed_width(shape.hidden, args.quantization)
                                  if args.quantization else 2 * shape.hidden),
                    # tuning fields JAX_MOK_TUNING sets for this run (gpu_check_ep.sh EP_ALSO)
                    "switches": {k: v for k, v in sorted((tuning.read("JAX_MOK_TUNING")
                                                          or {}).items()) if k != "check"},
                }
                elapsed = time.perf_counter() - t_start
                if elapsed > args.budget_s:
                    record["skipped"] = f"--budget-s {args.budget_s:.0f} used up"
                    emit(record)
                    continue
                p = params
                x = jax.device_put(
                    jax.random.normal(jax.random.key(1), (ep * tokens, shape.hidden), jnp.bfloat16),
                    NamedSharding(mesh, P("expert")),
                )
                if routing == "skewed":
                    scale = _skew_scale(x, p, config)
                    record["skew_scale"] = scale
                    p = _skewed(p, scale)
                # The routing this config measures, comparable with B5's (benchmarks.ep_torch):
                # the share of assignments that go to the hot 10 % of the experts.
                ids = route(x, p.router, p.router_bias, config)[0].topk_ids
                record["hot_share"] = problems.hot_share(np.asarray(ids), experts)
                for transport, progs in programs.items():
                    try:  # call figures first: a failing loop program still leaves them
                        for what in ("fwd", "fwd_bwd"):
                            _time(record, f"{transport}_{what}", progs[what], x, p)
                    except Exception as e:  # record and go on: one failure must not end it
                        record[f"{transport}_error"] = str(e)[:500]
                if routing == "balanced":
                    try:
                        record.update(_compute_only_ms(config, tokens, ep, gpus[0]))
                    except Exception as e:
                        record["compute_only_error"] = str(e)[:300]
                    spec = workspace.WorkspaceSpec.for_call(
                        config, tokens, ep * tokens, ep, jnp.bfloat16
                    )
                    ws = workspace.workspace_for(
                        mesh, "expert", spec, config,
                        limit_bytes=tuning.resolve().peer.workspace_limit_bytes) if ok else None
                    try:
                        record["exchange"] = _exchange_ms(
                            mesh, ep, spec.rows, shape.hidden, shape.top_k, ws
                        )
                    except Exception as e:
                        record["exchange_error"] = str(e)[:300]
                    _overlap(record)
                    if args.profile and (
                        args.profile_tokens is None
                        or str(tokens) in args.profile_tokens.split(",")
                    ):
                        _profile(record, programs, x, p)
                emit(record)


if __name__ == "__main__":
    main()
