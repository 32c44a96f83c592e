#!/bin/bash
# Call 4: the whole single-GPU suite at the final code commit (two processes on one GPU), S4 and
# S5 in FP8 (fresh processes, peak memory), a short e2e run with the FP8 variants.
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
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
timeout 130 python3 tools/kernel_timings.py timings --shapes S4 --quantization fp8_block,mxfp8 \
  --fp8-runs fwd,fwdbwd,fwd_prep,fwdbwd_prep > $OUT/s4.log 2>&1; echo "s4 rc=$?"
grep -E "^S4|^\| S4|FP8 matmul" $OUT/s4.log | cut -c1-300
timeout 45 python3 tools/kernel_timings.py timings --shapes S5 --quantization fp8_block,mxfp8 \
  --fp8-runs fwd,pq,fwd_prep,fwdbwd,fwdbwd_prep > $OUT/s5.log 2>&1; echo "s5 rc=$?"
grep -E "^S5 |^\| S5" $OUT/s5.log | grep -v peak | cut -c1-300
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.8
timeout ${E2E_TIMEOUT:-150} python3 -m benchmarks.e2e.run --layers 2 --batch 2 --steps 5 --warmup 1 \
  --variants jax_mok,jax_mok_fp8_block,jax_mok_fp8_block_prepared --out $OUT/e2e > $OUT/e2e.log 2>&1
echo "e2e rc=$?"; tail -25 $OUT/e2e.log
