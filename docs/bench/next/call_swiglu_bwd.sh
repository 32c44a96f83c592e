#!/bin/bash
# For the next device session (written in the thirteenth, not run): the SwiGLU-backward epilogue
# reading h in batches of 16 pairs (4 memory latencies per tile) instead of 8 (8 latencies), held
# as unconverted bf16 pairs — docs/bench/next/swiglu_bwd_batches.patch, ptxas-clean at a56b45d
# (72 kernels rebuilt, 0 findings; batches of 32 spilled 116–568 bytes in 5 kernels).
# Prepare on the CPU machine:
#   git worktree add /tmp/swb HEAD && (cd /tmp/swb && git apply docs/bench/next/swiglu_bwd_batches.patch)
#   build main into .device/ext-main and /tmp/swb into .device/ext-swb (cp312, jax 0.11.2)
# Then run with carry [".device/ext-main", ".device/ext-swb"]. Prediction: the dy·Wdᵀ + SwiGLU bwd
# GEMM (S1: BF16 2.38 ms, fp8_block 2.21 ms for 0.82 TFLOP) −15 to −30 % in both paths; no
# other phase changes; bits unchanged (the same arithmetic, loads reordered only).
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
use() { cp "$1"/_mok_c*.so jax_mok/ && echo "extension: $1"; }
prof() {  # prof LABEL SHAPES QUANT
  JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 80 \
    python3 tools/kernel_timings.py profile --shapes $2 --quantization $3 > "$OUT/prof_$1.log" 2>&1
  echo "profile $1 rc=$?"
}
use .device/ext-swb
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 240 $PYTEST \
  tests/test_cuda_kernels.py tests/test_ffi_attributes_cuda.py > $OUT/unit.log 2>&1 &
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 240 $PYTEST \
  tests/test_cuda_fp8.py > $OUT/fp8.log 2>&1
wait
echo "unit: $(tail -1 $OUT/unit.log)"; echo "fp8: $(tail -1 $OUT/fp8.log)"
prof swb_bf16 S1,S2 none; prof swb_block S1,S2 fp8_block
use .device/ext-main
prof main_bf16 S1,S2 none; prof main_block S1,S2 fp8_block
export PYTHONPATH=$PWD
for q in bf16 block; do
  python3 tools/kernel_timings.py compare $OUT/prof_main_$q.log $OUT/prof_swb_$q.log | grep -E "GEMM|total"
done
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log)
