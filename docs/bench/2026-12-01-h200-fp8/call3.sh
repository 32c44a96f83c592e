#!/bin/bash
# Call 3: the whole single-GPU suite (two processes on one GPU), the quantizers, the timings.
set -uo pipefail
export PYTHONUNBUFFERED=1 JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-unknown} PATH=/usr/local/cuda/bin:$PATH
cp .device/ext/_mok_c*.so jax_mok/ && export PYTHONPATH=$PWD
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
t=$(date +%s)
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 330 $PYTEST tests/test_cuda_fp8.py \
  tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py > $OUT/suite_fp8.log 2>&1 &
a=$!
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 330 $PYTEST -m "gpu and not multigpu" tests \
  --ignore=tests/test_cuda_fp8.py --ignore=tests/test_cuda_fp8_weights.py > $OUT/suite_rest.log 2>&1 &
b=$!
wait $a; ra=$?; wait $b; rb=$?
echo "suite fp8: rc=$ra $(tail -1 $OUT/suite_fp8.log)"
echo "suite rest: rc=$rb $(tail -1 $OUT/suite_rest.log)"
grep -E "^FAILED|^ERROR" $OUT/suite_fp8.log $OUT/suite_rest.log | head -20
echo "suite: $(( $(date +%s) - t )) s"
OUT=$OUT QUANT_TIMEOUT=60 QUANT_SHAPES=S1,S2,S4 TIMING_TIMEOUT=${TIMING_TIMEOUT:-250} \
  TIMING_SHAPES=${TIMING_SHAPES:-S1,S2,S3,S4,S6,S5} TIMING_QUANT=none,fp8_block,mxfp8 PROFILE_SHAPES=none TAIL=2 \
  bash tools/gpu_round.sh quant,timings > $OUT/round.log 2>&1
grep -A14 "HBM copy" $OUT/quantizers.log
grep "^| S\|ceiling\|failed" $OUT/timings.log
