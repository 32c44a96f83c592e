#!/usr/bin/env bash
# One device call that does several steps after one build, each under its own time limit, on a
# bare nvidia-h200-x2 (or nvidia-h200: the multi-GPU steps then report "skipped"):
#   OUT=/dir tools/gpu_round.sh STEP[,STEP...]
# Steps (in the order given):
#   fp8      GPU tests of the FP8 kernels (tests/test_cuda_fp8.py) on GPU 0, and at the same time
#            the BF16 kernel tests (test_cuda_kernels.py, test_ffi_attributes_cuda.py) on GPU 1
#   unit     the BF16 kernel tests alone (GPU 0)
#   multi    the multi-GPU tests (tests/test_peer_transport.py -m multigpu); then issue 18's
#            single-device-then-peer sequence once more with PeerTuning(check="deferred")
#   timings  tools/kernel_timings.py timings for TIMING_SHAPES (default S1..S6), bf16 and both
#            FP8 recipes, and the per-phase profile of S2 (FP8 and bf16)
#   bench    python -m benchmarks.run $BENCH_ARGS (the protocol table), BENCH_TIMEOUT (420 s)
#   ep       tools/ep_bench.py $EP_ARGS (peer vs xla vs compute-only), EP_TIMEOUT (200 s)
#   e2e      python -m benchmarks.e2e.run $E2E_ARGS, E2E_TIMEOUT (200 s)
# The last lines are a summary: each step's exit code and its last result line.
# Carried wheels: .whl/*.whl (nvidia-cutlass for the CuTe headers; liger-kernel for B6).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and the others below); nothing here resets,
# reclocks or repartitions a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
STEPS=${1:-fp8}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.8}
export JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PATH=/usr/local/cuda/bin:$PATH
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
step() { echo "=== $(date +%T) $*"; }
note() { echo "$*" | tee -a "$SUMMARY"; }

step "machine"
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,driver_version --format=csv,noheader \
  | tee "$OUT/machine.txt"
echo "commit $JAX_MOK_GIT_COMMIT" | tee -a "$OUT/machine.txt"
GPUS=$(nvidia-smi -L | wc -l)

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

step "build"
t0=$(date +%s)
JAX_MOK_CUDA=1 CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation \
  --no-deps -v -e . > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
note "build: $(( $(date +%s) - t0 )) s"
python3 -c "import jax_mok, jax_mok.kernels._ffi as f; m = f.cuda_module(); \
print('targets:', len(m.registrations()), m.device_info())" || exit 1

run() {  # run NAME TIMEOUT CMD...: the command's output to $OUT/NAME.log, a summary line
  local name=$1 limit=$2; shift 2
  step "$name"
  local t=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E "passed|failed|error|Error|^\| " "$OUT/$name.log" | tail -1)
  note "$name: rc=$rc ($(( $(date +%s) - t )) s) ${last:0:160}"
  tail -${TAIL:-15} "$OUT/$name.log"
}

PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
for s in ${STEPS//,/ }; do
  case "$s" in
    fp8)
      step "fp8 + unit in parallel (GPU 0: FP8, GPU 1: BF16)"
      t=$(date +%s)
      CUDA_VISIBLE_DEVICES=0 JAX_MOK_REQUIRE_CUDA=1 timeout ${FP8_TIMEOUT:-300} $PYTEST \
        tests/test_cuda_fp8.py > "$OUT/fp8_tests.log" 2>&1 &
      a=$!
      other=$(( GPUS > 1 ? 1 : 0 ))
      if [ "$other" = 1 ]; then
        CUDA_VISIBLE_DEVICES=1 JAX_MOK_REQUIRE_CUDA=1 timeout ${UNIT_TIMEOUT:-300} $PYTEST \
          tests/test_cuda_kernels.py tests/test_ffi_attributes_cuda.py > "$OUT/unit_tests.log" 2>&1 &
        b=$!
        wait $b; rb=$?
      fi
      wait $a; ra=$?
      note "fp8 tests: rc=$ra $(grep -E 'passed|failed' "$OUT/fp8_tests.log" | tail -1)"
      [ "$other" = 1 ] && note "unit tests: rc=$rb $(grep -E 'passed|failed' "$OUT/unit_tests.log" | tail -1)"
      grep -E "^FAILED|^ERROR|Error" "$OUT/fp8_tests.log" | head -20
      [ "$other" = 1 ] && grep -E "^FAILED|^ERROR" "$OUT/unit_tests.log" | head -20
      note "fp8+unit: $(( $(date +%s) - t )) s"
      ;;
    unit)
      JAX_MOK_REQUIRE_CUDA=1 run unit_tests ${UNIT_TIMEOUT:-300} $PYTEST tests/test_cuda_kernels.py \
        tests/test_ffi_attributes_cuda.py
      ;;
    multi)
      if [ "$GPUS" -lt 2 ]; then note "multi: skipped ($GPUS GPU)"; continue; fi
      JAX_MOK_REQUIRE_CUDA=1 run multi_tests ${MULTI_TIMEOUT:-360} $PYTEST -m multigpu \
        tests/test_peer_transport.py
      JAX_MOK_TUNING=check=deferred JAX_MOK_REQUIRE_CUDA=1 run hang_deferred 120 $PYTEST \
        "tests/test_peer_transport.py::test_single_device_step_then_peer_step"
      ;;
    timings)
      TAIL=40 run timings ${TIMING_TIMEOUT:-240} python3 tools/kernel_timings.py timings \
        --shapes ${TIMING_SHAPES:-S1,S2,S3,S4,S5,S6} --quantization none,fp8_block,mxfp8
      JAX_MOK_CUDA_PROFILE=1 TAIL=40 run profile 120 python3 tools/kernel_timings.py profile \
        --shapes ${PROFILE_SHAPES:-S2} --quantization fp8_block
      ;;
    bench)
      TAIL=60 run bench ${BENCH_TIMEOUT:-420} python3 -m benchmarks.run --out "$OUT/bench" \
        ${BENCH_ARGS:-}
      ;;
    ep)
      if [ "$GPUS" -lt 2 ]; then note "ep: skipped ($GPUS GPU)"; continue; fi
      TAIL=40 run ep ${EP_TIMEOUT:-200} python3 tools/ep_bench.py --out "$OUT/ep" ${EP_ARGS:-}
      ;;
    e2e)
      TAIL=30 run e2e ${E2E_TIMEOUT:-200} python3 -m benchmarks.e2e.run --out "$OUT/e2e" \
        ${E2E_ARGS:-}
      ;;
    *) note "unknown step $s" ;;
  esac
done

step "summary"
cat "$SUMMARY"
