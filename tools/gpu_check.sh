#!/usr/bin/env bash
# Build jax_mok on a bare GPU machine (no network), run the GPU tests, time the CUDA kernels,
# run the benchmark harness when it exists, and print a short table last.
#   OUT=/some/dir tools/gpu_check.sh [quick|kernels|full]   (quick: S1,S3,S6 kernel timings;
#   kernels: all shapes; full: + python -m benchmarks.run $BENCH_ARGS; ncu: build, smoke and
#   hardware counters of the forward GEMMs of S3 and S2; final: build, GPU tests and the harness
#   only, for a short device budget; bench: build, smoke and the harness, e.g. as a second call on a
#   machine still warm from a "kernels" call; validate: build, smoke, GPU tests and the per-phase
#   profile). Outputs land in $OUT. Env: TEST_TIMEOUT (300),
#   TIMING_TIMEOUT (240), PROFILE=0 (skip the per-phase times), NCU=1 (add the ncu
#   counters of NCU_SHAPES, default "S3 S2"), BENCH_ARGS, BENCH_TIMEOUT (400).
# Carried wheels: .whl/*.whl (nvidia-cutlass for the CuTe headers).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
MODE=${1:-full}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
# The device copy of the tree has no .git: pass JAX_MOK_GIT_COMMIT=$(git rev-parse --short HEAD)
# in the run command so that every benchmark record names its commit.
export JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PATH=/usr/local/cuda/bin:$PATH

step() { echo "=== $(date +%T) $*"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
echo "commit $JAX_MOK_GIT_COMMIT" | tee -a "$OUT/machine.txt"

step "carried wheels"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import cutlass_library, os; print('cutlass headers:', os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))" \
  || echo "WARNING: nvidia-cutlass not importable: the wgmma path will not be built"

step "build (pip install --no-build-isolation --no-deps -e .)"
t0=$(date +%s)
JAX_MOK_CUDA=1 CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps \
  -v -e . > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
grep -E "CUDA backend|cutlass headers not found|Found CUDAToolkit" "$OUT/build.log" | head -5
python3 -c "import jax_mok._mok_cuda as m; print('device_info:', m.device_info())" || exit 1
SO=$(find build -name '_mok_cuda*.so' | head -1)
if command -v cuobjdump >/dev/null && [ -n "$SO" ]; then
  cuobjdump -sass "$SO" > "$OUT/sass.txt" 2>/dev/null
  echo "SASS: $(grep -c HGMMA "$OUT/sass.txt") HGMMA, $(grep -c 'LDL\|STL' "$OUT/sass.txt") local-memory ops"
  gzip -f "$OUT/sass.txt"
fi

[ -n "$SO" ] && ldd "$SO" | grep -E "stdc|cudart" ; nm -D --defined-only "$SO" 2>/dev/null | grep -c "_ZNSo" | sed 's/^/exported ostream symbols: /'

step "smoke (one small fwd+bwd per dtype, every phase synchronized)"
JAX_MOK_CUDA_DEBUG_SYNC=1 timeout 90 python3 - <<'PY' 2>&1 | grep -v "^  File\|^    " | tail -40
import sys; sys.path.insert(0, "tests")
import jax.numpy as jnp, test_cuda_kernels as t
for dt in (jnp.float32, jnp.bfloat16):
    args = t._problem(1, 300, 256, 136, 8, 2, dt, "dropped")
    ref = t._reference(*args)
    got = t._cuda_fn()(*args)
    print(dt.__name__, "rel errors", [f"{t._rel(g, r):.2e}" for g, r in zip(got, ref)], flush=True)
PY
[ "${PIPESTATUS[0]}" = 0 ] || { echo "SMOKE FAILED: stopping"; exit 1; }

run_ncu() {
  # Hardware counters of the two forward GEMMs of S3 and S2 (balanced routing), one launch each.
  step "ncu"
  cat > /tmp/ncu_case.py <<'PY'
import sys, jax, jax.numpy as jnp
from jax_mok import autodiff
T, H, F, E, k = {"S3": (16384, 4096, 14336, 8, 2), "S2": (8192, 7168, 2048, 256, 8)}[sys.argv[1]]
ks = jax.random.split(jax.random.key(1), 4)
x = jax.random.normal(ks[0], (T, H), jnp.bfloat16)
u = min(E, 8)
wgu = jnp.tile((jax.random.normal(ks[1], (u, H, 2 * F)) / H**0.5).astype(jnp.bfloat16), (E // u, 1, 1))
wd = jnp.tile((jax.random.normal(ks[2], (u, F, H)) / F**0.5).astype(jnp.bfloat16), (E // u, 1, 1))
w, ids = jax.lax.top_k(jax.nn.softmax(jax.random.normal(ks[3], (T, E))), k)
f = jax.jit(lambda x, w, a, b: autodiff.routed_experts(x, ids, w, a, b, implementation="cuda"))
jax.block_until_ready(f(x, w, wgu, wd))
PY
  for s in ${NCU_SHAPES:-S3 S2}; do
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 ncu --clock-control none --kernel-name regex:wgmma_gemm --launch-count 2 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section SchedulerStats \
      python3 /tmp/ncu_case.py $s > "$OUT/ncu_$s.txt" 2>&1
    grep -E "wgmma_gemm_kernel|Duration|Throughput|Hit Rate|Achieved Occupancy|Registers|Stall|Issued|Eligible|Active Warps" "$OUT/ncu_$s.txt" | head -60
  done
}

if [ "$MODE" = ncu ]; then
  run_ncu
  exit 0
fi

run_profile() {
  step "per-phase device times (JAX_MOK_CUDA_PROFILE=1, one fwd+bwd per shape, saved h)"
  JAX_MOK_CUDA_PROFILE=1 timeout ${PROFILE_TIMEOUT:-120} python3 - "$MODE" <<'PY' 2>&1 | tee "$OUT/profile.txt"
import sys, jax, jax.numpy as jnp
from jax_mok import autodiff
SHAPES = {"S1": (32768, 2048, 768, 128, 8), "S2": (8192, 7168, 2048, 256, 8),
          "S3": (16384, 4096, 14336, 8, 2), "S4": (7168, 7168, 3072, 384, 6),
          "S5": (128, 7168, 2048, 256, 8), "S6": (8192, 2048, 2048, 32, 2)}
for name, (T, H, F, E, k) in SHAPES.items():
    ks = jax.random.split(jax.random.key(1), 6)
    x = jax.random.normal(ks[0], (T, H), jnp.bfloat16)
    wgu = jnp.tile((jax.random.normal(ks[1], (8, H, 2 * F)) / H**0.5).astype(jnp.bfloat16), (E // 8, 1, 1))
    wd = jnp.tile((jax.random.normal(ks[2], (8, F, H)) / F**0.5).astype(jnp.bfloat16), (E // 8, 1, 1))
    w, ids = jax.lax.top_k(jax.nn.softmax(jax.random.normal(ks[3], (T, E))), k)
    dy = jax.random.normal(ks[4], (T, H), jnp.bfloat16)
    def fb(x, w, a, b):
        y, vjp = jax.vjp(lambda x, w, a, b: autodiff.routed_experts(x, ids, w, a, b, implementation="cuda"), x, w, a, b)
        return y, vjp(dy)
    fb = jax.jit(fb)
    jax.block_until_ready(fb(x, w, wgu, wd))  # compile + first call
    print(f"--- {name} T={T} H={H} F={F} E={E} k={k} (second call below)", file=sys.stderr, flush=True)
    jax.block_until_ready(fb(x, w, wgu, wd))
    del x, wgu, wd, dy, fb
PY
}

TEST_RC=0
if [ "$MODE" != bench ]; then
  step "GPU tests"
  JAX_MOK_REQUIRE_CUDA=1 timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -p no:cacheprovider \
    tests/test_cuda_kernels.py 2>&1 | tee "$OUT/tests.log" | tail -25
  TEST_RC=${PIPESTATUS[0]}
fi

if [ "$MODE" = validate ]; then
  run_profile
  step "summary"
  grep -E "passed|failed|error" "$OUT/tests.log" | tail -3
  exit $TEST_RC
fi

if [ "$MODE" = final ] || [ "$MODE" = bench ]; then
  [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null && run_ncu
  # One lean run for a short device budget: build, GPU tests, then the harness (no extra timings).
  step "benchmark harness"
  timeout ${BENCH_TIMEOUT:-400} python3 -m benchmarks.run --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench.log" | grep -v "^  " | tail -60
  step "summary"
  [ -f "$OUT/tests.log" ] && grep -E "passed|failed|error" "$OUT/tests.log" | tail -3
  exit $TEST_RC
fi

step "kernel timings"
timeout ${TIMING_TIMEOUT:-240} python3 - "$MODE" <<'PY' 2>&1 | tee "$OUT/timings.txt"
# fwd: y; fwd+bwd: y and every gradient (returning y keeps XLA from dropping the forward call),
# with the gate/up pre-activations saved (default on CUDA) and recomputed (save_activations=False).
import sys, time, json, numpy as np, jax, jax.numpy as jnp
from jax_mok import autodiff
mode = sys.argv[1]
SHAPES = {"S1": (32768, 2048, 768, 128, 8), "S2": (8192, 7168, 2048, 256, 8),
          "S3": (16384, 4096, 14336, 8, 2), "S4": (7168, 7168, 3072, 384, 6),
          "S5": (128, 7168, 2048, 256, 8), "S6": (8192, 2048, 2048, 32, 2)}
if mode == "quick":
    SHAPES = {k: SHAPES[k] for k in ("S1", "S3", "S6")}
UNIQUE = 8  # distinct random experts, tiled to E (keeps the f32 generation temporaries small)

def bench(f, *a, n=20):
    for _ in range(3): jax.block_until_ready(f(*a))
    ts = []
    for _ in range(n):
        t = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t)
    return float(np.median(ts))

k1, k2 = jax.random.split(jax.random.key(0))
A = jax.random.normal(k1, (8192, 8192), jnp.bfloat16); B = jax.random.normal(k2, (8192, 8192), jnp.bfloat16)
mm = jax.jit(lambda a, b: a @ b)
ceil = 2 * 8192**3 / bench(mm, A, B) / 1e12
del A, B
print(f"bf16 matmul ceiling (XLA 8192^3): {ceil:.0f} TFLOP/s")
rows = []
for name, (T, H, F, E, k) in SHAPES.items():
    ks = jax.random.split(jax.random.key(1), 6)
    x = jax.random.normal(ks[0], (T, H), jnp.bfloat16)
    u = min(E, UNIQUE)
    wgu = (jax.random.normal(ks[1], (u, H, 2 * F), jnp.float32) / H**0.5).astype(jnp.bfloat16)
    wd = (jax.random.normal(ks[2], (u, F, H), jnp.float32) / F**0.5).astype(jnp.bfloat16)
    wgu, wd = jnp.tile(wgu, (E // u, 1, 1)), jnp.tile(wd, (E // u, 1, 1))
    logits = jax.random.normal(ks[3], (T, E))
    w, ids = jax.lax.top_k(jax.nn.softmax(logits), k)
    dy = jax.random.normal(ks[4], (T, H), jnp.bfloat16)
    fwd = jax.jit(lambda x, w, a, b: autodiff.routed_experts(x, ids, w, a, b, implementation="cuda"))
    def make_fb(save):
        def fb(x, w, a, b):
            y, vjp = jax.vjp(lambda x, w, a, b: autodiff.routed_experts(
                x, ids, w, a, b, implementation="cuda", save_activations=save), x, w, a, b)
            return y, vjp(dy)
        return jax.jit(fb)
    flops = 6 * T * k * H * F
    tf = bench(fwd, x, w, wgu, wd, n=10)
    tb = {}
    for save in (True, False):
        try:
            tb[save] = bench(make_fb(save), x, w, wgu, wd, n=5)
        except Exception as e:  # e.g. out of memory for the weight gradients
            print(f"{name}: fwd+bwd (save={save}) failed: {str(e)[:200]}")
            tb[save] = float("nan")
    rows.append((name, tf * 1e3, flops / tf / 1e12, tb[True] * 1e3, 3 * flops / tb[True] / 1e12,
                 tb[False] * 1e3, 3 * flops / tb[False] / 1e12))
    print(f"{name}: fwd {tf*1e3:.3f} ms {flops/tf/1e12:.0f} TFLOP/s | fwd+bwd saved {tb[True]*1e3:.3f} ms "
          f"{3*flops/tb[True]/1e12:.0f} | recomputed {tb[False]*1e3:.3f} ms {3*flops/tb[False]/1e12:.0f}",
          flush=True)
    del x, wgu, wd, dy, fwd
print("\n| shape | fwd ms | fwd TFLOP/s | % ceil | fwd+bwd ms (saved h) | TFLOP/s | % ceil | fwd+bwd ms (recompute) | TFLOP/s |")
print("|---|---|---|---|---|---|---|---|---|")
for n, a, b, c, d, e, f in rows:
    print(f"| {n} | {a:.3f} | {b:.0f} | {100*b/ceil:.0f} | {c:.3f} | {d:.0f} | {100*d/ceil:.0f} | {e:.3f} | {f:.0f} |")
PY

[ "${PROFILE:-1}" = 1 ] && run_profile

[ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null && run_ncu

step "summary"
grep -E "passed|failed|error" "$OUT/tests.log" | tail -3
sed -n '/^| shape/,$p' "$OUT/timings.txt"
exit $TEST_RC
