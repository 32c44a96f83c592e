#!/bin/bash
# For the next device session (written in the thirteenth, not run): MoEConfig(
# fp8_weight_gradients="unquantized") — docs/bench/next/fp8_unquantized_weight_grads.patch: the FP8
# backward computes the two weight gradients with the BF16 layer's routed-K GEMMs on x, dy, w·a
# and dh (x and dy gathered once into expert order) instead of FP8 GEMMs on operands quantized
# along tokens; backward.cu's weight-gradient GEMMs moved into WeightGradients (shared). CPU side
# tested at 7422896 + patch (tests/test_fp8.py, test_fp8_weights.py, test_ffi_attributes.py,
# test_validation.py, test_ep_fp8_rows.py: 92 passed); CUDA build ptxas-clean (78 kernels).
# Prepare on the CPU machine: a worktree with the patch applied -> .device/ext-wg; main ->
# .device/ext-main. Run with carry [".device/ext-main", ".device/ext-wg"].
# Prediction (S1, from r13's profiles): fp8_block fwd+bwd −1.1 ms (quantize along tokens 2.28 +
# FP8 dW 3.53 -> gather 1.17 + BF16 dW 3.43), S2 ~−1 ms; y and the data gradients bitwise
# unchanged; BF16's own backward unchanged (the refactor moves code only).
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
use() { cp "$1"/_mok_c*.so jax_mok/ && echo "extension: $1"; }
use .device/ext-wg
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 280 $PYTEST \
  tests/test_cuda_kernels.py tests/test_ffi_attributes_cuda.py > $OUT/unit.log 2>&1 &
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 280 $PYTEST \
  tests/test_cuda_fp8.py tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py > $OUT/fp8.log 2>&1
wait
echo "unit: $(tail -1 $OUT/unit.log)"; echo "fp8: $(tail -1 $OUT/fp8.log)"
grep -E "^FAILED|^ERROR" $OUT/unit.log $OUT/fp8.log | head
for wg in fp8 unquantized; do
  JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 80 \
    python3 tools/kernel_timings.py profile --shapes S1,S2 --quantization fp8_block \
    --fp8-weight-grads $wg > $OUT/prof_$wg.log 2>&1; echo "profile $wg rc=$?"
done
PYTHONPATH=$PWD python3 tools/kernel_timings.py compare $OUT/prof_fp8.log $OUT/prof_unquantized.log \
  | grep -E "GEMM|quantize a|gather|total"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 PYTHONPATH=$PWD timeout 150 python3 tools/kernel_timings.py \
  timings --shapes S1,S2,S3,S6 --quantization none,fp8_block --fp8-runs fwdbwd,fwdbwd_prep \
  --fp8-weight-grads unquantized > $OUT/timings_unquantized.log 2>&1
echo "timings rc=$?"; grep -E "^\| S[0-9] \||ceiling|failed" $OUT/timings_unquantized.log | cut -c1-200
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log)
