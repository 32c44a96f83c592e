#!/bin/bash
# r14 call 1: ext-main = main 3f23e56's kernels; ext-dev = main + docs/bench/next's three patches
# (swiglu_bwd_batches, glu_quant_batched, fp8_unquantized_weight_grads) + dh quantized in the FP8
# dy Wd^T epilogue (kSwiGLUBwdQuant). Tests on ext-dev, then per-phase profiles and timings.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD
use() { cp "$1"/_mok_c*.so jax_mok/ && echo "extension: $1"; }
prof() {  # prof LABEL SHAPES QUANT [extra]
  JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 80 \
    python3 tools/kernel_timings.py profile --shapes $2 --quantization $3 ${4:-} > "$OUT/prof_$1.log" 2>&1
  echo "profile $1 rc=$?"
}
use .device/ext-dev
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 280 $PYTEST \
  tests/test_cuda_kernels.py tests/test_ffi_attributes_cuda.py > $OUT/unit.log 2>&1 &
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 280 $PYTEST \
  tests/test_cuda_fp8.py tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py > $OUT/fp8.log 2>&1
wait
echo "unit: $(tail -1 $OUT/unit.log)"; echo "fp8: $(tail -1 $OUT/fp8.log)"
grep -E "^FAILED|^ERROR" $OUT/unit.log $OUT/fp8.log | head
prof dev_bf16 S1 none; prof dev_block S1,S2 fp8_block; prof dev_blockU S1,S2 fp8_block "--fp8-weight-grads unquantized"
use .device/ext-main; prof main_bf16 S1 none; prof main_block S1,S2 fp8_block
python3 tools/kernel_timings.py compare $OUT/prof_main_bf16.log $OUT/prof_dev_bf16.log | grep -E "GEMM|total"
python3 tools/kernel_timings.py compare $OUT/prof_main_block.log $OUT/prof_dev_block.log | grep -E "GEMM|quantize|total"
python3 tools/kernel_timings.py compare $OUT/prof_dev_block.log $OUT/prof_dev_blockU.log | grep -E "GEMM|quantize a|gather|total"
use .device/ext-dev
XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 170 python3 tools/kernel_timings.py \
  timings --shapes S1,S2,S3,S6 --quantization none,fp8_block --fp8-runs fwdbwd,fwdbwd_prep \
  --fp8-weight-grads unquantized > $OUT/timings_devU.log 2>&1
echo "timings rc=$?"; grep -E "^\| S[0-9] \||ceiling|failed" $OUT/timings_devU.log | cut -c1-220
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log)
