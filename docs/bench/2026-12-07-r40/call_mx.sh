#!/bin/bash
# mxfp8 through the BF16 GEMMs on one GPU: its tests, the FP8 kernel tests beside them, then the
# A/B of the two mxfp8 GEMM paths against our BF16 (tools/mx_ab.py), raw logs into $OUT.
#   carry [".device/ext-mx", ".whl"]
#   OUT=$OUT JAX_MOK_GIT_COMMIT=<head> bash docs/bench/2026-12-07-r40/call_mx.sh [SHAPES] [AB_S] [PROF_S]
# SHAPES: tools/mx_ab.py's (default S1,S6,S3,S2); AB_S: its time limit (default 330 s); PROF_S:
# the per-phase profile's (S1, default 100 s).
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1
export JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:?pass JAX_MOK_GIT_COMMIT=<head>}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv,noheader \
  | tee "$OUT/machine.txt"
echo "commit $JAX_MOK_GIT_COMMIT" | tee -a "$OUT/machine.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
cp .device/ext-mx/_mok_c*.so jax_mok/ || exit 1
echo "extension md5 $(md5sum jax_mok/_mok_cuda*.so | cut -c1-8)" | tee -a "$OUT/machine.txt"
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
t=$SECONDS
timeout 240 $PYTEST tests/test_cuda_mx_bf16.py tests/test_mx_bf16.py > "$OUT/mx_tests.log" 2>&1 &
a=$!
timeout 240 $PYTEST tests/test_cuda_fp8.py > "$OUT/fp8_tests.log" 2>&1 &
b=$!
wait $a; ra=$?
wait $b; rb=$?
echo "mx tests rc=$ra: $(tail -1 "$OUT/mx_tests.log")"
echo "fp8 tests rc=$rb: $(tail -1 "$OUT/fp8_tests.log")"
grep -E "FAILED|Error|rel error" "$OUT/mx_tests.log" | head -20
echo "tests: $(( SECONDS - t )) s"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 timeout "${2:-330}" python3 tools/mx_ab.py \
  --shapes "${1:-S1,S6,S3,S2}" > "$OUT/mx_ab.log" 2>&1
echo "mx_ab rc=$?"
tail -40 "$OUT/mx_ab.log"
# Per-phase device times (the kernels print each stage with JAX_MOK_CUDA_PROFILE=1), S1, one
# timed call per variant after one warm-up.
JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 timeout "${3:-100}" python3 \
  tools/mx_ab.py --shapes S1 --iters 1 --warmup 1 > "$OUT/mx_profile.log" 2>&1
echo "mx profile rc=$?"
