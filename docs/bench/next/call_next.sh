#!/bin/bash
# For the next device session (written in the thirteenth, not run): two kernel patches, each
# ptxas-clean on the CPU machine at 7422896, neither run on a GPU:
#   swiglu_bwd_batches.patch  the SwiGLU-backward epilogue (BF16 and FP8 dy·Wdᵀ) reads h 16 pairs
#                             per batch, held as unconverted bf16x2 (4 memory latencies per tile,
#                             not 8). Predicted: that GEMM −15 to −30 % in both paths.
#   glu_quant_batched.patch   the FP8 gate/up epilogue quantizes its 32 pairs straight-line and
#                             redoes the rare unsettled pair after (no branch per pair).
#                             Predicted: fp8 gate/up −5 to −10 %.
# Both keep the bits (loads reordered; the same arithmetic). Prepare on the CPU machine:
#   for p in swiglu_bwd_batches glu_quant_batched; do git worktree add /tmp/$p HEAD
#     (cd /tmp/$p && git apply docs/bench/next/$p.patch); done
#   git worktree add /tmp/both HEAD && (cd /tmp/both && git apply docs/bench/next/*.patch)
#   build main -> .device/ext-main, /tmp/swiglu_bwd_batches -> .device/ext-swb,
#   /tmp/glu_quant_batched -> .device/ext-gq, /tmp/both -> .device/ext-both (cp312, jax 0.11.2)
# Run with carry [".device/ext-main", ".device/ext-swb", ".device/ext-gq", ".device/ext-both"]
# (~46 MB). Land a patch only if its tests pass and its phase wins.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
use() { cp "$1"/_mok_c*.so jax_mok/ && echo "extension: $1"; }
prof() {  # prof LABEL SHAPES QUANT
  JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 80 \
    python3 tools/kernel_timings.py profile --shapes $2 --quantization $3 > "$OUT/prof_$1.log" 2>&1
  echo "profile $1 rc=$?"
}
use .device/ext-both
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 260 $PYTEST \
  tests/test_cuda_kernels.py tests/test_ffi_attributes_cuda.py > $OUT/unit.log 2>&1 &
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 260 $PYTEST \
  tests/test_cuda_fp8.py > $OUT/fp8.log 2>&1
wait
echo "unit (both patches): $(tail -1 $OUT/unit.log)"; echo "fp8 (both patches): $(tail -1 $OUT/fp8.log)"
grep -E "^FAILED|^ERROR" $OUT/unit.log $OUT/fp8.log | head
use .device/ext-main; prof main_bf16 S1 none; prof main_block S1,S2 fp8_block
use .device/ext-swb; prof swb_bf16 S1 none; prof swb_block S1,S2 fp8_block
use .device/ext-gq; prof gq_block S1,S2 fp8_block
export PYTHONPATH=$PWD
python3 tools/kernel_timings.py compare $OUT/prof_main_bf16.log $OUT/prof_swb_bf16.log | grep -E "GEMM|total"
for v in swb gq; do
  python3 tools/kernel_timings.py compare $OUT/prof_main_block.log $OUT/prof_${v}_block.log | grep -E "GEMM|total"
done
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log)
