#!/usr/bin/env bash
# Expert-parallel peer transport on a bare nvidia-h200-x2 machine (issue 5): build, probe peer
# access, smoke the exchange against lax.all_to_all, run the multigpu tests, time EP (B4 vs peer).
#   OUT=/some/dir tools/gpu_check_ep.sh [smoke|tests|bench|bw|full]   (default full; outputs in $OUT)
#   bw: build, probe, tools/peer_bw.py (the exchange alone over chunk sizes) once per BW_SETS entry;
#   smoke: build, probe, exchange == all_to_all; tests: + multigpu tests; bench: build, probe,
#   tools/ep_bench.py and B5 (benchmarks.ep_torch, PyTorch NCCL all_to_all_single + B3 compute;
#   EP_B5=0 skips it, B5_TIMEOUT / B5_BUDGET_S bound it, B5_ARGS replaces EP_BENCH_ARGS for it);
#   EP_DEFERRED=0 skips the S1 / 8192 rerun with the tuning check=deferred (no host sync per
#   peer call); EP_ALSO="key=value,...[;key=value,...]" reruns S1 / 8192 once per ';'-separated
#   JAX_MOK_TUNING setting (e.g. "copy=sm;copy=sm,ctas_per_sm=4"); EP_INNER (20): in-program
#   repetitions of each ep_bench timing; EP_PROFILE=1: a profiler
#   trace of each transport's layer per balanced config (device time per XLA op and kernel:
#   tools/device_profile.py); the EP table is printed last;
#   full: everything (more than one 600-s device call: split it).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0); nothing here calls cuMulticast*.
# The peer workspace lives outside XLA's pool: XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 leaves room.
# JAX_MOK_CUDA_DEBUG_SYNC stays off here: a host sync per launch could itself serialize the two
# devices if XLA launched them from one thread (the smoke runs both check modes).
# Every run sets JAX_MOK_TUNING="$TUNING_BASE[,...]" (peer calls time out after 5 s here).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
MODE=${1:-full}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.8}
TUNING_BASE=${TUNING_BASE:-timeout_ms=5000}
export JAX_MOK_TUNING=$TUNING_BASE
# The device copy's .git is the session's first commit: pass JAX_MOK_GIT_COMMIT=<sha> so that the
# records (ep_bench, B5) name the tree that ran.
export JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PATH=/usr/local/cuda/bin:$PATH
step() { echo "=== $(date +%T) $*"; }

step "machine"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
nvidia-smi topo -m | tee -a "$OUT/machine.txt"

step "carried wheels"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

step "build"
JAX_MOK_CUDA=1 CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps \
  -v -e . > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
grep -E "CUDA backend" "$OUT/build.log" | head -2

step "peer probe"
timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/probe.txt"
import jax, numpy as np
import jax_mok._mok_cuda as m
from jax_mok.ep import workspace
print("registrations:", sorted(m.registrations()))
n = len(jax.devices("gpu"))
for a in range(n):
    for b in range(n):
        if a != b:
            print(f"can_access_peer({a},{b}) =", m.can_access_peer(a, b))
print("fabric_supported(0) =", m.fabric_supported(0))
mesh = jax.sharding.Mesh(np.array(jax.devices("gpu")), ("expert",))
print("peer_transport_available:", workspace.peer_transport_available(mesh, "expert"))
print("bootstrap_path:", workspace.bootstrap_path(mesh, "expert"))
PY

TEST_RC=0
if [ "$MODE" = bw ]; then
  # The exchange's bandwidth over chunk sizes, once per tuning. BW_SETS: ';'-separated
  # JAX_MOK_TUNING settings; BW_SIZES: tools/peer_bw.py --sizes. Copy engines (the default),
  # then the kernel's SM stores and their grid.
  D=check=deferred SM=check=deferred,copy=sm
  IFS=';' read -ra bw_sets <<< "${BW_SETS:-$D;$SM;$SM,ctas_per_sm=4;$SM,ctas_per_sm=1}"
  for set in "${bw_sets[@]}"; do
    step "peer exchange bandwidth with $set"
    JAX_MOK_TUNING="$TUNING_BASE,$set" timeout ${BW_TIMEOUT:-120} python3 tools/peer_bw.py \
      --out "$OUT/bw.jsonl" ${BW_SIZES:+--sizes $BW_SIZES} 2>&1 | grep -v "^WARNING" | tail -12
  done
  exit 0
fi
if [ "$MODE" != bench ]; then
step "smoke: peer.dispatch / combine == all_to_all path (each check mode, SM stores)"
# Copy engines are the default; the exchange kernel's own stores (copy=sm) are smoked too.
for variant in check=sync check=deferred check=sync,copy=sm; do
  JAX_MOK_TUNING="$TUNING_BASE,$variant" timeout ${SMOKE_TIMEOUT:-120} python3 - <<'PY' 2>&1 | tail -15
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
from jax_mok import tuning
from jax_mok.ep import peer, workspace
from jax_mok.ep.layer import shard_map
t = tuning.resolve().peer
gpus = jax.devices("gpu"); ep = len(gpus)
mesh = jax.sharding.Mesh(np.array(gpus), ("expert",))
spec = workspace.WorkspaceSpec(ep, 64, 256, 4, "bfloat16")
ws = workspace.workspace_for(mesh, "expert", spec)
s = P("expert")
k = jax.random.split(jax.random.key(0), 3)
x = jax.random.normal(k[0], (ep * ep, 64, 256), jnp.bfloat16)
ids = jax.random.randint(k[1], (ep * ep, 64, 4), -1, 8, jnp.int32)
w = jax.random.uniform(k[2], (ep * ep, 64, 4))
a2a = lambda a, b, c: tuple(jax.lax.all_to_all(v, "expert", 0, 0, tiled=True) for v in (a, b, c))
pf = jax.jit(shard_map(lambda a, b, c: peer.dispatch(a, b, c, ws, t), mesh, (s,) * 3, (s,) * 3))
xf = jax.jit(shard_map(a2a, mesh, (s,) * 3, (s,) * 3))
want = xf(x, ids, w)
for i in range(4):  # back-to-back: epochs and halves alternate
    got = pf(x, ids, w)
    ok = all(np.array_equal(np.asarray(g), np.asarray(v)) for g, v in zip(got, want))
    print(t, "dispatch call", i, "bitwise equal to all_to_all:", ok)
home = jnp.tile(jnp.arange(64, dtype=jnp.int32)[:, None], (ep, ep))  # [ep*64, ep]
cf = jax.jit(shard_map(lambda r, h: peer.combine(r, h, ws, peer=t), mesh, (s, s), s))
def ref(r, h):
    back = jax.lax.all_to_all(r, "expert", 0, 0, tiled=True)
    return back.astype(jnp.float32).sum(0)
rf = jax.jit(shard_map(ref, mesh, (s, s), s))
rows = x[:, :, :]
print(t, "combine equal:",
      np.array_equal(np.asarray(cf(rows, home)), np.asarray(rf(rows, home))))
PY
done
[ "$MODE" = smoke ] && exit 0

step "multigpu tests"
JAX_MOK_REQUIRE_CUDA=1 timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider \
  tests/test_peer_transport.py tests/test_workspace.py \
  tests/test_sharding.py::test_home_sum_kernel_equals_xla_bitwise 2>&1 | tee "$OUT/tests_ep.log" | tail -30
TEST_RC=${PIPESTATUS[0]}
[ "$MODE" = tests ] && exit $TEST_RC
fi

step "EP benchmark (B4 = transport xla vs peer)"
timeout ${BENCH_TIMEOUT:-420} python3 tools/ep_bench.py --out "$OUT/ep.jsonl" --inner ${EP_INNER:-20} ${EP_PROFILE:+--profile} \
  ${EP_BENCH_ARGS:---shapes S1,S2 --tokens 4096,8192,16384 --expert-scale 1} 2>&1 | tail -30
rerun_s1() {  # S1 / 8192 once more with the tuning "$1" (JAX_MOK_TUNING keys)
  step "EP benchmark, S1 8192, with $1"
  JAX_MOK_TUNING="$TUNING_BASE,$1" timeout ${DEFERRED_TIMEOUT:-150} python3 tools/ep_bench.py \
    --out "$OUT/ep.jsonl" --inner ${EP_INNER:-20} --shapes S1 --tokens 8192 --reps 5 2>&1 | tail -4
}
# The default check mode syncs the host after every peer call; what does that cost?
[ "${EP_DEFERRED:-1}" = 1 ] && rerun_s1 "check=deferred"
# EP_ALSO="copy=sm;copy=sm,ctas_per_sm=4": one rerun per ';'-separated tuning
if [ -n "${EP_ALSO:-}" ]; then
  IFS=';' read -ra also_sets <<< "$EP_ALSO"
  for set in "${also_sets[@]}"; do rerun_s1 "$set"; done
fi
if [ "${EP_B5:-1}" != 0 ]; then
step "B5 (PyTorch NCCL)"
timeout ${B5_TIMEOUT:-300} python3 -m benchmarks.ep_torch --out "$OUT/ep_torch.jsonl" \
  --budget-s ${B5_BUDGET_S:-240} \
  ${B5_ARGS:-${EP_BENCH_ARGS:---shapes S1,S2 --tokens 4096,8192,16384 --expert-scale 1}} 2>&1 | tail -40
fi
step "EP table"
python3 tools/ep_table.py "$OUT/ep.jsonl" $([ -f "$OUT/ep_torch.jsonl" ] && echo "$OUT/ep_torch.jsonl") \
  | tee "$OUT/ep_table.md"
step "summary"
[ -f "$OUT/tests_ep.log" ] && grep -E "passed|failed|error" "$OUT/tests_ep.log" | tail -3
exit $TEST_RC
