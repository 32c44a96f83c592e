#!/bin/bash
# Call 3: the whole single-GPU suite (two processes on one GPU) with the quarter-pipelined FP8
# consumer, then timings (both recipes) and the S1/S2 per-phase profile.
set -uo pipefail
export PYTHONUNBUFFERED=1 JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-unknown} PATH=/usr/local/cuda/bin:$PATH
cp .device/ext/_mok_c*.so jax_mok/ && export PYTHONPATH=$PWD
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
t=$(date +%s)
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 300 $PYTEST tests/test_cuda_fp8.py \
  tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py > $OUT/suite_fp8.log 2>&1 &
a=$!
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 300 $PYTEST -m "gpu and not multigpu" tests \
  --ignore=tests/test_cuda_fp8.py --ignore=tests/test_cuda_fp8_weights.py > $OUT/suite_rest.log 2>&1 &
b=$!
wait $a; ra=$?; wait $b; rb=$?
echo "suite fp8: rc=$ra $(tail -1 $OUT/suite_fp8.log)"
echo "suite rest: rc=$rb $(tail -1 $OUT/suite_rest.log)"
grep -E "^FAILED|^ERROR" $OUT/suite_fp8.log $OUT/suite_rest.log | head -20
echo "suite: $(( $(date +%s) - t )) s"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.85
timeout 150 python3 tools/kernel_timings.py timings --shapes S1,S2,S3,S6 --quantization fp8_block,mxfp8 \
  --fp8-runs fwd,fwdbwd,fwd_prep,fwdbwd_prep > $OUT/timings.log 2>&1; echo "timings rc=$?"
grep "ceiling\|failed\|^S[0-9].*kernels" $OUT/timings.log | cut -c1-250
JAX_MOK_CUDA_PROFILE=1 timeout 60 python3 tools/kernel_timings.py profile --shapes S1,S2 \
  --quantization fp8_block > $OUT/profile_fp8.log 2>&1; echo "profile rc=$?"
awk '/second call below/{p=1} p' $OUT/profile_fp8.log | grep -E "^---|GEMM|quantize" | head -40
echo "total: $(( $(date +%s) - t )) s"
