#!/bin/bash
# Twelfth session, device call 3 (carry .device/ext-seg = call 2's build + quantize_segments
# walking all column tiles of its 128 positions with the next tile's loads in flight): the FP8
# tests on it, the S1/S2 fp8_block per-phase profile (forward+backward, then the prepared
# forward), timings, and ncu of the S1 fp8_block forward GEMMs on the new epilogue.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
# (The quantize_segments change lost and was reverted: fafd014 holds it.)
cp .device/ext-seg/_mok_c*.so jax_mok/
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 200 $PYTEST \
  tests/test_cuda_fp8.py tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py > $OUT/fp8_tests.log 2>&1
echo "fp8 tests rc=$? $(tail -1 $OUT/fp8_tests.log)"; grep -E "^FAILED|^ERROR" $OUT/fp8_tests.log | head
JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 80 \
  python3 tools/kernel_timings.py profile --shapes S1,S2 --quantization fp8_block \
  > "$OUT/profile_seg.log" 2>&1; echo "profile rc=$?"
awk '/second call below/{p=1} p' "$OUT/profile_seg.log" | grep -E "^---|GEMM|quantize" | head -30
XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 PYTHONPATH=$PWD timeout 150 python3 tools/kernel_timings.py \
  timings --shapes S1,S2,S3,S6 --quantization none,fp8_block \
  --fp8-runs fwd,fwdbwd,fwd_prep,fwdbwd_prep > "$OUT/timings_seg.log" 2>&1
echo "timings rc=$?"; grep -E "^\| S[0-9] \||ceiling|failed" "$OUT/timings_seg.log" | cut -c1-200
mkdir -p /tmp/n
XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD timeout 150 ncu --clock-control none \
  --set full --import-source no -k "regex:fp8_gemm_kernel" --launch-count 2 -f -o /tmp/n/fp8_S1_seg \
  python3 tools/kernel_timings.py forward --shapes S1 --quantization fp8_block > /tmp/n/ncu.log 2>&1
echo "ncu rc=$?"
ncu --import /tmp/n/fp8_S1_seg.ncu-rep --print-details all > /tmp/n/fp8_S1_seg.txt 2>&1
ncu --import /tmp/n/fp8_S1_seg.ncu-rep --page source --csv --print-source sass > /tmp/n/fp8_S1_seg_sass.csv 2>&1
grep -E "^    Duration|Tensor Cycles Active  |L2 Cache Throughput|DRAM Throughput" /tmp/n/fp8_S1_seg.txt | head -8
(cd /tmp/n && tar czf $OUT/ncu_seg.tgz fp8_S1_seg.txt fp8_S1_seg_sass.csv ncu.log)
