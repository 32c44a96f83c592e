#!/usr/bin/env bash
# Build jax_mok on a bare GPU machine (no network), run the GPU tests, time the CUDA kernels,
# run the benchmark harness when it exists, and print a short table last.
#   OUT=/some/dir tools/gpu_check.sh [quick|kernels|full]   (quick: S1,S3,S6 kernel timings;
#   kernels: all shapes; full: + python -m benchmarks.run $BENCH_ARGS; ncu: build, smoke and
#   hardware counters of the forward GEMMs of S3 and S2; final: build, GPU tests and the harness
#   only, for a short device budget; bench: build, smoke and the harness, e.g. as a second call on a
#   machine still warm from a "kernels" call; validate: build, smoke, GPU tests and the per-phase
#   profile). Outputs land in $OUT. Env: TEST_TIMEOUT (300),
#   TIMING_TIMEOUT (240), PROFILE=0 (skip the per-phase times), PROFILE_ALSO="VAR=value ..."
#   (profile a second time with those variables set and print both side by side), NCU=1 (add the ncu
#   counters of NCU_SHAPES, default "S3 S2"), BENCH_ARGS, BENCH_TIMEOUT (400),
#   TIMING_QUANTIZATION (kernel timings' --quantization, default none; e.g. none,fp8_block,mxfp8),
#   PROFILE_QUANTIZATION (FP8 recipes to profile per phase after the bf16 profile, e.g.
#   "fp8_block mxfp8"; each into profile_<recipe>.txt).
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
  for s in ${NCU_SHAPES:-S3 S2}; do
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 ncu --clock-control none --kernel-name regex:wgmma_gemm --launch-count 2 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section SchedulerStats \
      python3 tools/kernel_timings.py forward --shapes $s > "$OUT/ncu_$s.txt" 2>&1
    grep -E "wgmma_gemm_kernel|Duration|Throughput|Hit Rate|Achieved Occupancy|Registers|Stall|Issued|Eligible|Active Warps" "$OUT/ncu_$s.txt" | head -60
  done
}

if [ "$MODE" = ncu ]; then
  run_ncu
  exit 0
fi

run_profile() {
  step "per-phase device times (JAX_MOK_CUDA_PROFILE=1, one fwd+bwd per shape, saved h)"
  JAX_MOK_CUDA_PROFILE=1 timeout ${PROFILE_TIMEOUT:-120} python3 tools/kernel_timings.py profile \
    2>&1 | tee "$OUT/profile.txt"
  if [ -n "${PROFILE_ALSO:-}" ]; then  # e.g. PROFILE_ALSO="JAX_MOK_TUNING=pregather_x=1"
    step "per-phase device times again with $PROFILE_ALSO"
    env $PROFILE_ALSO JAX_MOK_CUDA_PROFILE=1 timeout ${PROFILE_TIMEOUT:-120} \
      python3 tools/kernel_timings.py profile > "$OUT/profile_also.txt" 2>&1
    python3 tools/kernel_timings.py compare "$OUT/profile.txt" "$OUT/profile_also.txt"
  fi
  for q in ${PROFILE_QUANTIZATION:-}; do
    step "per-phase device times, quantization=$q"
    JAX_MOK_CUDA_PROFILE=1 timeout ${PROFILE_TIMEOUT:-120} python3 tools/kernel_timings.py profile \
      --quantization "$q" > "$OUT/profile_$q.txt" 2>&1
    grep -E "^--- |jax_mok CUDA profile" "$OUT/profile_$q.txt" | tail -40
  done
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
timeout ${TIMING_TIMEOUT:-240} python3 tools/kernel_timings.py timings --quantization "${TIMING_QUANTIZATION:-none}" \
  --shapes $( [ "$MODE" = quick ] && echo S1,S3,S6 || echo S1,S2,S3,S4,S5,S6 ) 2>&1 \
  | tee "$OUT/timings.txt"

[ "${PROFILE:-1}" = 1 ] && run_profile

[ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null && run_ncu

step "summary"
grep -E "passed|failed|error" "$OUT/tests.log" | tail -3
sed -n '/^| shape/,$p' "$OUT/timings.txt"
exit $TEST_RC
