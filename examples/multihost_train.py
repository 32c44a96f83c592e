"""Multi-process training of the tiny MoE LM: jax.distributed + a data x expert mesh.

Every process runs this script. The experts are sharded over the mesh axis "expert", the batch
over ("data", "expert"), everything else is replicated. The training step is plain pjit-style
code: no jax_mok context and no mesh argument; jax_mok.moe reads the shardings of its inputs when
XLA partitions the step (expert parallelism over "expert", XLA all_to_all) and jax.jit does the
rest.

On one machine, 2 CPU processes talking over localhost (gloo collectives), 2 devices each:

    python examples/multihost_train.py --launch 2

or start each process yourself (one per GPU host, the same command with its --process-id):

    python examples/multihost_train.py --coordinator host0:12345 --num-processes 2 --process-id 0
    python examples/multihost_train.py --coordinator host0:12345 --num-processes 2 --process-id 1

Each process prints its losses and, at the end, a checksum of the replicated parameters
(identical on every process when the run is healthy).
"""

from __future__ import annotations

import argparse
import pathlib
import socket
import subprocess
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launch", type=int, default=0,
                   help="start this many local processes (CPU, localhost) and wait for them")
    p.add_argument("--coordinator", default=None, help="host:port of process 0")
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument("--cpu-devices", type=int, default=2,
                   help="CPU devices per process (ignored on GPUs)")
    p.add_argument("--expert-parallel", type=int, default=2, help="size of the 'expert' axis")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


def launch(args: argparse.Namespace) -> int:
    """Starts ``args.launch`` copies of this script on localhost; returns the worst exit code."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    forwarded = [a for a in sys.argv[1:] if not a.startswith("--launch")]
    if "--launch" in sys.argv:  # drop the value of a separate "--launch N"
        i = sys.argv.index("--launch")
        forwarded = sys.argv[1:i] + sys.argv[i + 2:]
    procs = [
        subprocess.Popen([sys.executable, __file__, *forwarded,
                          "--coordinator", f"127.0.0.1:{port}",
                          "--num-processes", str(args.launch), "--process-id", str(rank)])
        for rank in range(args.launch)
    ]
    codes = [proc.wait() for proc in procs]
    return max(codes, key=abs)


def train(args: argparse.Namespace) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    if args.num_processes > 1:
        # CPU collectives across processes go over gloo; GPUs use NCCL and ignore this.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=args.coordinator,
                                   num_processes=args.num_processes,
                                   process_id=args.process_id)

    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from moe_lm import CharData, LMConfig, MoELM, loss_fn

    rank, world = jax.process_index(), jax.process_count()
    devices = jax.devices()
    ep = args.expert_parallel
    if len(devices) % ep:
        raise ValueError(f"--expert-parallel={ep} must divide the {len(devices)} devices")
    mesh = jax.make_mesh((len(devices) // ep, ep), ("data", "expert"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)

    def log(*parts) -> None:
        # One write per line: the processes share a pipe, and a prefix written separately from
        # its message can be interleaved with the other process's output.
        message = " ".join(str(p) for p in parts)
        sys.stdout.write(f"[process {rank}/{world}] {message}\n")
        sys.stdout.flush()
    log(f"{len(devices)} devices ({jax.local_device_count()} local, "
        f"{jax.default_backend()}), mesh {dict(mesh.shape)}")

    data = CharData()
    config = LMConfig(vocab_size=data.vocab_size, seq_len=args.seq_len, hidden=args.hidden,
                      heads=2, layers=2, experts=args.experts, top_k=2, ffn=args.hidden,
                      capacity_factor=None)
    model = MoELM(config, rngs=nnx.Rngs(0))  # same seed everywhere: same initial weights
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    # Experts (leading dim E of w_gate_up / w_down) over "expert"; everything else replicated.
    def placement(path, leaf):
        names = {getattr(k, "key", None) for k in path}
        spec = P("expert") if names & {"w_gate_up", "w_down"} else P()
        return NamedSharding(mesh, spec)

    def put(tree):
        shardings = jax.tree_util.tree_map_with_path(placement, tree)
        return jax.tree.map(
            lambda a, s: jax.make_array_from_callback(a.shape, s, lambda i, a=a: np.asarray(a)[i]),
            tree, shardings), shardings

    params, param_shardings = put(params)
    rest, _ = put(rest)
    optimizer = optax.adam(args.lr)
    replicated = NamedSharding(mesh, P())

    def on_mesh(leaf):
        """Leaves jit placed on one local device (e.g. Adam's step count) -> replicated."""
        if isinstance(leaf.sharding, NamedSharding):
            return leaf
        value = np.asarray(leaf)
        return jax.make_array_from_callback(value.shape, replicated, lambda i: value[i])

    opt_state = jax.tree.map(on_mesh, jax.jit(optimizer.init)(params))
    batch_sharding = NamedSharding(mesh, P(("data", "expert")))

    def step(params, opt_state, rest, tokens):
        def loss(params):
            return loss_fn(nnx.merge(graphdef, params, rest), tokens)

        (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value, metrics

    # Pin the output layouts to the input ones: one compilation for the whole run.
    opt_shardings = jax.tree.map(lambda a: a.sharding, opt_state)
    step = jax.jit(step, donate_argnums=(0, 1),
                   out_shardings=(param_shardings, opt_shardings, None, None))
    rng = np.random.default_rng(1234)  # same stream on every process: a global batch
    losses = []
    start = time.perf_counter()
    for i in range(1, args.steps + 1):
        global_batch = data.batch(rng, args.batch, args.seq_len)
        tokens = jax.make_array_from_callback(global_batch.shape, batch_sharding,
                                              lambda idx, b=global_batch: b[idx])
        params, opt_state, value, metrics = step(params, opt_state, rest, tokens)
        losses.append(float(metrics["ce"]))
        if i == 1 or i % args.log_every == 0 or i == args.steps:
            load = np.asarray(jax.device_get(metrics["expert_counts"])).sum(0)
            log(f"step {i:4d}  loss {losses[-1]:.4f}  expert load {load.tolist()}  "
                f"{time.perf_counter() - start:.1f}s")

    # Replicated parameters must agree across processes: checksum this process's copies.
    copies = [leaf for leaf in jax.tree.leaves(params) if leaf.sharding.is_fully_replicated]
    checksum = sum(float(np.asarray(leaf.addressable_data(0), np.float64).sum())
                   for leaf in copies)
    expert_w = [leaf for leaf in jax.tree.leaves(params) if not leaf.sharding.is_fully_replicated]
    log(f"RESULT first_loss={losses[0]:.6f} last_loss={losses[-1]:.6f} "
        f"replicated_checksum={checksum:.10e} replicated_leaves={len(copies)} "
        f"expert_sharded_leaves={len(expert_w)}")
    if args.num_processes > 1:
        jax.distributed.shutdown()


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.launch:
        sys.exit(launch(args))
    if args.num_processes > 1 and not args.coordinator:
        raise SystemExit("--num-processes > 1 needs --coordinator host:port (or use --launch N)")
    train(args)


if __name__ == "__main__":
    main()
