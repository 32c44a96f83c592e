#!/bin/bash
# Call 1: the kernel tests the change touches (FP8 GEMM clusters, the batched epilogue loads), then
# timings with the FP8 GEMMs in 2-CTA clusters (default) and without (JAX_MOK_CUDA_FP8_CLUSTER=1).
set -uo pipefail
export PYTHONUNBUFFERED=1 JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-unknown} PATH=/usr/local/cuda/bin:$PATH
cp .device/ext/_mok_c*.so jax_mok/ && export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv,noheader
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE -x"
t=$(date +%s)
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 240 $PYTEST tests/test_cuda_fp8.py \
  > $OUT/tests_fp8.log 2>&1 &
a=$!
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 240 $PYTEST tests/test_cuda_kernels.py \
  > $OUT/tests_bf16.log 2>&1 &
b=$!
wait $a; ra=$?; wait $b; rb=$?
echo "tests fp8: rc=$ra $(tail -1 $OUT/tests_fp8.log)"
echo "tests bf16 kernels: rc=$rb $(tail -1 $OUT/tests_bf16.log)"
grep -E "^FAILED|^ERROR" $OUT/tests_fp8.log $OUT/tests_bf16.log | head -20
echo "tests: $(( $(date +%s) - t )) s"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.85
timeout 200 python3 tools/kernel_timings.py timings --shapes S1,S2,S3,S6 --quantization none,fp8_block \
  --fp8-runs fwd,fwdbwd,fwd_prep,fwdbwd_prep > $OUT/timings.log 2>&1; echo "timings rc=$?"
JAX_MOK_CUDA_FP8_CLUSTER=1 timeout 100 python3 tools/kernel_timings.py timings --shapes S1,S2,S3,S6 \
  --quantization fp8_block --fp8-runs fwd_prep,fwdbwd_prep > $OUT/timings_c1.log 2>&1; echo "timings c1 rc=$?"
grep "^| S\|ceiling\|failed\|^S[0-9]" $OUT/timings.log | cut -c1-250
echo "--- cluster 1:"; grep "^S[0-9]\|failed" $OUT/timings_c1.log | cut -c1-250
echo "total: $(( $(date +%s) - t )) s"
