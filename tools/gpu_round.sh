#!/usr/bin/env bash
# One device call that does several steps after one build, each under its own time limit, on a
# bare nvidia-h200-x2 (or nvidia-h200: the multi-GPU steps then report "skipped"):
#   OUT=/dir tools/gpu_round.sh STEP[,STEP...]
# Steps (in the order given):
#   fp8      GPU tests of the FP8 kernels (tests/test_cuda_fp8.py) on GPU 0, and at the same time
#            the weight quantizer's and fp8_weights' tests (and on two GPUs the BF16 kernel tests:
#            test_cuda_kernels.py, test_ffi_attributes_cuda.py) on GPU 1, or on GPU 0 beside them
#   unit     the BF16 kernel tests alone (GPU 0)
#   multi    the multi-GPU tests (tests/test_peer_transport.py -m multigpu); then issue 18's
#            single-device-then-peer sequence once more with PeerTuning(check="deferred")
#   timings  tools/kernel_timings.py timings for TIMING_SHAPES (default S1..S6), TIMING_QUANT
#            (bf16 and both FP8 recipes; TIMING_FP8_RUNS: which FP8 runs), then the per-phase
#            profile (the step below) unless PROFILE_SHAPES is none; TIMING_WGRAD: the FP8
#            runs' MoEConfig.fp8_weight_gradients (fp8 | unquantized)
#   profile  the per-phase profile (JAX_MOK_CUDA_PROFILE=1 tools/kernel_timings.py profile) of
#            PROFILE_SHAPES (S2) in each recipe of PROFILE_QUANT (fp8_block; a list),
#            PROFILE_TIMEOUT (120 s) each
#   timeline tools/kernel_timings.py timeline of PROFILE_SHAPES (S2) in each recipe of PROFILE_QUANT
#            (fp8_block; a list), PROFILE_TIMEOUT (120 s) each: wall time, back-to-back time and
#            a trace's kernels, busy and idle time per fwd+bwd call (what the profile's phases,
#            each timed after a host sync, leave out)
#   clocks   tools/kernel_timings.py clocks of CLOCK_SHAPES (S1,S6), CLOCK_S (3) seconds of load
#            each, CLOCK_TIMEOUT (150 s): the ceiling's bf16 dot and the layers' fwd+bwd alone
#            after idle, fresh, under sustained load and right after, with the SM clock and its
#            limits sampled
#   bench    python -m benchmarks.run $BENCH_ARGS (the protocol table) into $OUT/bench (bench_TAG with
#            ROUND_TAG), BENCH_TIMEOUT (420 s)
#   ep       tools/ep_bench.py $EP_ARGS (peer vs xla vs compute-only), EP_TIMEOUT (200 s)
#   e2e      python -m benchmarks.e2e.run $E2E_ARGS, E2E_TIMEOUT (200 s)
#   suite    the whole single-GPU suite in two processes on GPU 0 (each with 40 % of its memory):
#            the FP8 tests (test_cuda_fp8*.py, test_fp8_weights.py) beside every other GPU-marked
#            test that needs one GPU, SUITE_TIMEOUT (300 s) each
#   tests    pytest $TESTS (test files and options, e.g. "tests/test_cuda_mx_bf16.py -k dh"),
#            TESTS_TIMEOUT (200 s)
#   fp8w     the expert-weight quantizer's bit tests and tests/test_fp8_weights.py (fp8_weights on
#            the CUDA path: values and gradients equal the plain call's)
#   quant    tools/kernel_timings.py quantizers (the CUDA quantizers' GB/s against the HBM copy)
#   ncu      ncu's full set (source counters included) of NCU_COUNT (2) launches of NCU_KERNEL
#            (fp8_gemm_kernel; wgmma_gemm_kernel for bf16; matched against NCU_NAME_BASE names:
#            function, or mangled) in one forward of NCU_SHAPE (S2) in NCU_RECIPE (fp8_block, or
#            none), or NCU_WHAT=profile: two forward+backward calls, NCU_TIMEOUT (150 s): details
#            and per-SASS CSV logs
#   traffic  ncu counters of TRAFFIC_SHAPE's (S2) forward GEMMs in TRAFFIC_RECIPES ("fp8_block
#            none"): DRAM bytes, L2 read sectors and misses by source unit
#   ab       builds bitwise (tools/compare_builds.py): AB_BASE's extension against each of AB_DEV's
#            (a space-separated list; default .device/ext-base, .device/ext-dev), each in its own
#            process
#   profab   per-phase profiles of every build, AB_SHAPES (S1,S2) x AB_QUANT ("none fp8_block"),
#            and tools/kernel_timings.py compare of AB_BASE against each of AB_DEV's
# The steps after ab / profab run with the extension they left in place (AB_DEV's first).
# The last lines are a summary: each step's exit code and its last result line; the step logs
# end up in $OUT/logs.tgz (with summary.txt and machine.txt beside it). ROUND_TAG=name makes
# them logs_name.tgz and summary_name.txt, so that several rounds of one call share $OUT without
# a caller renaming anything.
# Carried wheels: .whl/*.whl (nvidia-cutlass for the CuTe headers; liger-kernel for B6).
# A prebuilt extension: $EXT_DIR/_mok_c*.so (default .device/ext; built on the CPU machine for
# Python 3.12 / jax 0.11.2, carried with carry=[".device/ext"]) is used instead of building here
# (~50 s saved).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and the others below); nothing here resets,
# reclocks or repartitions a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
STEPS=${1:-fp8}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.8}
# The device machine's copy of .git can be older than the working tree it runs (it named the
# session's first commit on every later call), so pass JAX_MOK_GIT_COMMIT=<hash> from here.
export JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PATH=/usr/local/cuda/bin:$PATH
TAG=${ROUND_TAG:+_$ROUND_TAG}
case "$TAG" in *[!A-Za-z0-9_.-]*) echo "ROUND_TAG=$ROUND_TAG: letters, digits, '_', '.', '-' only"; exit 2 ;; esac
SUMMARY="$OUT/summary$TAG.txt"
: > "$SUMMARY"
# Logs already in $OUT (a caller's, written there while this runs) are not this run's: the
# archive at the end leaves them where they are.
FOREIGN_LOGS=$(cd "$OUT" && ls ./*.log 2>/dev/null)
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

# use_ext DIR: DIR's prebuilt extension in place, its MD5 in the summary (the tools print the MD5
# of the module they load: tools/kernel_timings.py, tools/compare_builds.py; the two must agree).
# An editable install (the build branch below, `pip install -e .`) leaves an import hook that
# loads the extension from its build directory whatever lies in jax_mok/: every later copy on the
# same machine would then run that build (an A/B would compare that build with itself), so the
# module's origin is checked too.
use_ext() {
  cp "$1"/_mok_c*.so jax_mok/ || { note "use_ext $1: copy failed"; return 1; }
  local origin
  origin=$(PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python3 -c \
    "import importlib.util as u; print(u.find_spec('jax_mok._mok_cuda').origin)" 2>&1 | tail -1)
  if [ "$(realpath "$origin" 2>/dev/null)" != "$(realpath jax_mok/_mok_cuda*.so)" ]; then
    note "use_ext $1: jax_mok._mok_cuda loads from $origin, not jax_mok/ (an editable install?" \
      "pip uninstall -y jax_mok)"
    return 1
  fi
  note "extension $1: md5 $(md5sum jax_mok/_mok_cuda*.so | cut -c1-8)"
}

step "build"
t0=$(date +%s)
EXT_DIR=${EXT_DIR:-.device/ext}
if ls "$EXT_DIR"/_mok_cuda*.so >/dev/null 2>&1; then
  use_ext "$EXT_DIR" || exit 1
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  note "build: prebuilt extension from $EXT_DIR"
else
  JAX_MOK_CUDA=1 CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation \
    --no-deps -v -e . > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  note "build: $(( $(date +%s) - t0 )) s"
fi
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

# run, for the benchmark harnesses: each sets its own memory fraction (benchmarks/run.py 0.9,
# which S4's FP8 fwd+bwd needs; benchmarks/e2e 0.92), which the 0.8 exported above for the other
# steps would override.
run_harness() { (unset XLA_PYTHON_CLIENT_MEM_FRACTION; run "$@"); }

# The per-phase profile of PROFILE_SHAPES (S2) in each recipe of PROFILE_QUANT (fp8_block; a
# space-separated list), one log each, PROFILE_TIMEOUT (120 s) each.
# profiles [MODE]: kernel_timings.py MODE (profile: per-phase times, which the kernels print with
# JAX_MOK_CUDA_PROFILE=1; timeline: run as they are, unprofiled) for each recipe of PROFILE_QUANT
profiles() {
  local mode=${1:-profile} q
  for q in ${PROFILE_QUANT:-fp8_block}; do
    JAX_MOK_CUDA_PROFILE=$([ "$mode" = profile ] && echo 1 || echo 0) TAIL=40 run "${mode}_$q" \
      ${PROFILE_TIMEOUT:-120} python3 tools/kernel_timings.py "$mode" \
      --shapes ${PROFILE_SHAPES:-S2} --quantization "$q"
  done
}

PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
AB_BASE=${AB_BASE:-.device/ext-base} AB_DEV=${AB_DEV:-.device/ext-dev}  # ab, profab
AB_DEV1=${AB_DEV%% *}  # the first of AB_DEV's builds: the one left in place
for s in ${STEPS//,/ }; do
  case "$s" in
    fp8)
      # The FP8 kernel tests, and beside them the expert-weight quantizer's and fp8_weights'
      # tests (one GPU: both processes on it, each with 40 % of its memory); with two GPUs the
      # BF16 kernel tests run on GPU 1 as well.
      step "fp8 tests in parallel"
      t=$(date +%s)
      other=$(( GPUS > 1 ? 1 : 0 ))
      frac=$([ "$other" = 1 ] && echo 0.8 || echo 0.4)
      CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_MEM_FRACTION=$frac JAX_MOK_REQUIRE_CUDA=1 \
        timeout ${FP8_TIMEOUT:-300} $PYTEST tests/test_cuda_fp8.py > "$OUT/fp8_tests.log" 2>&1 &
      a=$!
      CUDA_VISIBLE_DEVICES=$other XLA_PYTHON_CLIENT_MEM_FRACTION=$frac JAX_MOK_REQUIRE_CUDA=1 \
        timeout ${FP8_TIMEOUT:-300} $PYTEST tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py \
        $([ "$other" = 1 ] && echo tests/test_cuda_kernels.py tests/test_ffi_attributes_cuda.py) \
        > "$OUT/fp8w_tests.log" 2>&1 &
      b=$!
      wait $b; rb=$?
      wait $a; ra=$?
      note "fp8 tests: rc=$ra $(grep -E 'passed|failed' "$OUT/fp8_tests.log" | tail -1)"
      note "fp8 weights (+unit on 2 GPUs) tests: rc=$rb $(grep -E 'passed|failed' "$OUT/fp8w_tests.log" | tail -1)"
      grep -E "^FAILED|^ERROR|Error" "$OUT/fp8_tests.log" | head -20
      grep -E "^FAILED|^ERROR" "$OUT/fp8w_tests.log" | head -20
      note "fp8 tests: $(( $(date +%s) - t )) s"
      ;;
    suite)
      step "single-GPU suite, two processes"
      # SIGINT at the limit: pytest then names the test it was in and prints its summary (the
      # tests done, the slowest ones); SIGKILL 20 s later if it has not ended.
      SUITE_LIMIT="timeout -s INT -k 20 ${SUITE_TIMEOUT:-300}"
      t=$(date +%s)
      XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 $SUITE_LIMIT $PYTEST --durations=8 \
        tests/test_cuda_fp8.py tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py \
        > "$OUT/suite_fp8.log" 2>&1 &
      a=$!
      XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 $SUITE_LIMIT $PYTEST --durations=8 \
        -m "gpu and not multigpu" tests --ignore=tests/test_cuda_fp8.py \
        --ignore=tests/test_cuda_fp8_weights.py --ignore=tests/test_fp8_weights.py \
        > "$OUT/suite_rest.log" 2>&1 &
      b=$!
      wait $a; ra=$?; wait $b; rb=$?
      note "suite fp8: rc=$ra $(tail -1 "$OUT/suite_fp8.log")"
      note "suite rest: rc=$rb $(tail -1 "$OUT/suite_rest.log")"
      grep -E "^FAILED|^ERROR" "$OUT/suite_fp8.log" "$OUT/suite_rest.log" | head -20
      note "suite: $(( $(date +%s) - t )) s"
      ;;
    clocks)
      TAIL=20 run clocks ${CLOCK_TIMEOUT:-150} python3 tools/kernel_timings.py clocks \
        --shapes ${CLOCK_SHAPES:-S1,S6} --seconds ${CLOCK_S:-3}
      ;;
    tests)
      JAX_MOK_REQUIRE_CUDA=1 run tests ${TESTS_TIMEOUT:-200} $PYTEST ${TESTS:?tests: set TESTS}
      ;;
    fp8w)
      JAX_MOK_REQUIRE_CUDA=1 run fp8w_tests ${FP8W_TIMEOUT:-240} $PYTEST \
        tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py
      ;;
    fp8only)
      JAX_MOK_REQUIRE_CUDA=1 run fp8_tests ${FP8_TIMEOUT:-300} $PYTEST tests/test_cuda_fp8.py
      ;;
    quant)
      TAIL=30 run quantizers ${QUANT_TIMEOUT:-120} python3 tools/kernel_timings.py quantizers \
        --shapes ${QUANT_SHAPES:-S1,S2,S4} --quantization ${QUANT_RECIPES:-fp8_block,mxfp8}
      ;;
    ncu)
      # JAX without a preallocated pool (ncu saves and restores the device memory in use on
      # every replay pass), one forward that exits, the report exported and read back: with a
      # preallocating JAX over a long program the process did not exit and nothing came back.
      n=ncu_${NCU_SHAPE:-S2}_${NCU_RECIPE:-fp8_block}
      # NCU_WHAT=profile: two forward+backward calls instead (the backward's kernels; e.g. the
      # weight-gradient GEMMs: NCU_NAME_BASE=mangled NCU_KERNEL=ModeE2E, the routed-K wgmma ones).
      # (kernel_timings.py's profile reads the phase times the kernels print: JAX_MOK_CUDA_PROFILE.)
      prof=0; [ "${NCU_WHAT:-forward}" = profile ] && prof=1
      JAX_MOK_CUDA_PROFILE=${JAX_MOK_CUDA_PROFILE:-$prof} XLA_PYTHON_CLIENT_PREALLOCATE=false TAIL=3 run "$n" ${NCU_TIMEOUT:-150} ncu \
        --clock-control none --set full --import-source no \
        --kernel-name-base ${NCU_NAME_BASE:-function} -k "regex:${NCU_KERNEL:-fp8_gemm_kernel}" \
        --launch-count ${NCU_COUNT:-2} -f -o "/tmp/$n" python3 tools/kernel_timings.py \
        ${NCU_WHAT:-forward} --shapes ${NCU_SHAPE:-S2} --quantization ${NCU_RECIPE:-fp8_block}
      ncu --import "/tmp/$n.ncu-rep" --print-details all > "$OUT/${n}_details.log" 2>&1
      # per-SASS stall samples, CSV (tools/ncu_sass.py)
      ncu --import "/tmp/$n.ncu-rep" --page source --csv --print-source sass \
        > "$OUT/${n}_sass.log" 2>&1
      grep -E "_gemm_kernel|^    Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Shared Memory|Tensor" \
        "$OUT/${n}_details.log" | cut -c1-150 | head -40
      ;;
    traffic)
      # DRAM and L2 traffic of the forward GEMMs, by counters only (~30 s a recipe): bytes read
      # and written, L2 read sectors and their misses, split by source unit (the SMs' loads,
      # cp.async included, against all requests: TMA's are the difference). S2's FP8 GEMMs moved
      # ~2.3x their weights' size through DRAM, the BF16 ones ~1.2x (docs/perf-notes.md). The
      # environment passes through (a candidate's MOK_EXP_* switch, e.g.).
      m=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_read.sum
      m=$m,lts__t_sectors_op_read_lookup_miss.sum,lts__t_sectors_srcunit_tex_op_read.sum
      m=$m,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,gpu__time_duration.sum
      for q in ${TRAFFIC_RECIPES:-fp8_block none}; do
        XLA_PYTHON_CLIENT_PREALLOCATE=false TAIL=0 run "traffic_${TRAFFIC_SHAPE:-S2}_$q" \
          ${NCU_TIMEOUT:-90} ncu --clock-control none --metrics "$m" \
          -k "regex:fp8_gemm_kernel|wgmma_gemm_kernel" --launch-count 2 python3 \
          tools/kernel_timings.py forward --shapes ${TRAFFIC_SHAPE:-S2} --quantization $q
        grep -E "_gemm_kernel|dram__|lts__|gpu__time" "$OUT/traffic_${TRAFFIC_SHAPE:-S2}_$q.log" \
          | cut -c1-120
      done
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
        --shapes ${TIMING_SHAPES:-S1,S2,S3,S4,S5,S6} \
        --quantization ${TIMING_QUANT:-none,fp8_block,mxfp8} \
        ${TIMING_FP8_RUNS:+--fp8-runs $TIMING_FP8_RUNS} \
        ${TIMING_WGRAD:+--fp8-weight-grads $TIMING_WGRAD}
      [ "${PROFILE_SHAPES:-S2}" = none ] || profiles
      ;;
    profile)
      profiles
      ;;
    timeline)
      profiles timeline
      ;;
    bench)
      # bench$TAG: several rounds of one call (ROUND_TAG) keep their own results and worker logs
      TAIL=60 run_harness bench ${BENCH_TIMEOUT:-420} python3 -m benchmarks.run \
        --out "$OUT/bench$TAG" ${BENCH_ARGS:-}
      ;;
    ep)
      if [ "$GPUS" -lt 2 ]; then note "ep: skipped ($GPUS GPU)"; continue; fi
      TAIL=40 run ep ${EP_TIMEOUT:-200} python3 tools/ep_bench.py --out "$OUT/ep" ${EP_ARGS:-}
      ;;
    e2e)
      TAIL=30 run_harness e2e ${E2E_TIMEOUT:-200} python3 -m benchmarks.e2e.run \
        --out "$OUT/e2e" ${E2E_ARGS:-}
      ;;
    ab)
      for ext in $AB_DEV "$AB_BASE"; do
        use_ext "$ext" || continue
        XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 run "ab_$(basename "$ext")" ${AB_TIMEOUT:-150} \
          python3 tools/compare_builds.py run "/tmp/ab_$(basename "$ext").npz"
      done
      for ext in $AB_DEV; do
        TAIL=10 run "ab_compare_$(basename "$ext")" 30 python3 tools/compare_builds.py compare \
          "/tmp/ab_$(basename "$AB_BASE").npz" "/tmp/ab_$(basename "$ext").npz"
      done
      use_ext "$AB_DEV1"
      ;;
    profab)
      for q in ${AB_QUANT:-none fp8_block}; do
        for ext in "$AB_BASE" $AB_DEV; do
          use_ext "$ext" || continue
          JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 TAIL=0 \
            run "prof_$(basename "$ext")_$q" ${PROFILE_TIMEOUT:-120} python3 \
            tools/kernel_timings.py profile --shapes ${AB_SHAPES:-S1,S2} --quantization $q
        done
        for ext in $AB_DEV; do
          python3 tools/kernel_timings.py compare "$OUT/prof_$(basename "$AB_BASE")_$q.log" \
            "$OUT/prof_$(basename "$ext")_$q.log" | tee "$OUT/profab_$(basename "$ext")_$q.txt" \
            | grep -E "GEMM|gather|quantize|total"
        done
      done
      use_ext "$AB_DEV1"
      ;;
    *) note "unknown step $s" ;;
  esac
done

step "summary"
cat "$SUMMARY"
# A call returns at most 8 files of $OUT: the step logs leave as one archive.
(cd "$OUT" && logs=$(ls ./*.log 2>/dev/null | grep -vxF "${FOREIGN_LOGS:-/}") \
  && [ -n "$logs" ] && tar czf "logs$TAG.tgz" $logs && rm -f $logs)
