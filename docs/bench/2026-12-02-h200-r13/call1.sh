#!/bin/bash
# Thirteenth session, device call 1 (carry .device/ext-new = main's kernels, .device/ext-alt =
# the FP8 consumers taking turns at each promotion group, .device/ext-ftz = ext-alt + the
# sigmoid's e^-v by ex2.approx.ftz): a smoke test of ext-alt first (the new named barriers could
# hang: every step has a timeout), the per-phase profiles (S1, S2 fp8_block; S1 mxfp8) of all
# three builds in one run, the FP8 tests on ext-ftz (it holds both changes), then ncu of ext-alt's
# S1 fp8_block forward GEMMs.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
use() { cp "$1"/_mok_c*.so jax_mok/ && echo "extension: $1"; }
prof() {  # prof LABEL SHAPES QUANT
  JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 90 \
    python3 tools/kernel_timings.py profile --shapes $2 --quantization $3 > "$OUT/prof_$1.log" 2>&1
  echo "profile $1 rc=$?"
}
use .device/ext-alt
for q in fp8_block mxfp8; do
  t0=$(date +%s)
  PYTHONPATH=$PWD timeout 90 python3 tools/kernel_timings.py forward --shapes S6 --quantization $q \
    > $OUT/smoke_$q.log 2>&1
  echo "smoke alt $q rc=$? $(( $(date +%s) - t0 )) s"; tail -2 $OUT/smoke_$q.log
done
prof alt_block S1,S2 fp8_block
prof alt_mx S1 mxfp8
use .device/ext-new
prof new_block S1,S2 fp8_block
prof new_mx S1 mxfp8
use .device/ext-ftz
prof ftz_block S1,S2 fp8_block
for l in alt ftz; do
  python3 tools/kernel_timings.py compare $OUT/prof_new_block.log $OUT/prof_${l}_block.log | grep -E "GEMM|total"
done
python3 tools/kernel_timings.py compare $OUT/prof_new_mx.log $OUT/prof_alt_mx.log | grep -E "GEMM|total"
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 200 $PYTEST \
  tests/test_cuda_fp8.py tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py > $OUT/fp8_tests_ftz.log 2>&1
echo "fp8 tests (ftz) rc=$? $(tail -1 $OUT/fp8_tests_ftz.log)"; grep -E "^FAILED|^ERROR" $OUT/fp8_tests_ftz.log | head
use .device/ext-alt
mkdir -p /tmp/n
XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD timeout 100 ncu --clock-control none \
  --set full --import-source no -k "regex:fp8_gemm_kernel" --launch-count 2 -f -o /tmp/n/alt_S1 \
  python3 tools/kernel_timings.py forward --shapes S1 --quantization fp8_block > /tmp/n/ncu.log 2>&1
echo "ncu rc=$?"
ncu --import /tmp/n/alt_S1.ncu-rep --print-details all > /tmp/n/alt_S1.txt 2>&1
ncu --import /tmp/n/alt_S1.ncu-rep --page source --csv --print-source sass > /tmp/n/alt_S1_sass.csv 2>&1
grep -E "^    Duration|Tensor Cycles Active  |L2 Cache Throughput|DRAM Throughput" /tmp/n/alt_S1.txt | head -8
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log)
(cd /tmp/n && tar czf $OUT/ncu_alt.tgz alt_S1.txt alt_S1_sass.csv ncu.log)
