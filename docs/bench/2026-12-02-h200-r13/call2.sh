#!/bin/bash
# Thirteenth session, device call 2 (carry .device/ext-new = main's kernels, .device/ext-q = the
# quantizers without smem bank conflicts (quantize_segments) and without a 64-bit division per
# item (quantize_rows), .device/ext-qt = ext-q + fp8_block's consumers taking turns): the FP8
# tests on ext-qt, the per-phase profiles of the three builds (S1, S2 fp8_block; S1 mxfp8 on
# ext-q), then ext-qt's timings (bf16 and fp8_block, S1 S2 S3 S6).
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
use() { cp "$1"/_mok_c*.so jax_mok/ && echo "extension: $1"; }
prof() {  # prof LABEL SHAPES QUANT
  JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 80 \
    python3 tools/kernel_timings.py profile --shapes $2 --quantization $3 > "$OUT/prof_$1.log" 2>&1
  echo "profile $1 rc=$?"
}
use .device/ext-qt
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 180 $PYTEST \
  tests/test_cuda_fp8.py tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py > $OUT/fp8_tests_qt.log 2>&1
echo "fp8 tests (qt) rc=$? $(tail -1 $OUT/fp8_tests_qt.log)"; grep -E "^FAILED|^ERROR" $OUT/fp8_tests_qt.log | head
prof qt_block S1,S2 fp8_block
use .device/ext-q
prof q_block S1,S2 fp8_block
prof q_mx S1 mxfp8
use .device/ext-new
prof new_block S1,S2 fp8_block
export PYTHONPATH=$PWD
for l in q qt; do
  python3 tools/kernel_timings.py compare $OUT/prof_new_block.log $OUT/prof_${l}_block.log | grep -E "GEMM|total|quantize a|quantize r|quantize dh"
done
grep -E "quantize|GEMM" $OUT/prof_q_mx.log | tail -14
use .device/ext-qt
XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 150 python3 tools/kernel_timings.py \
  timings --shapes S1,S2,S3,S6 --quantization none,fp8_block \
  --fp8-runs fwdbwd,fwd_prep,fwdbwd_prep > "$OUT/timings_qt.log" 2>&1
echo "timings rc=$?"; grep -E "^\| S[0-9] \||ceiling|failed" "$OUT/timings_qt.log" | cut -c1-200
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log)
