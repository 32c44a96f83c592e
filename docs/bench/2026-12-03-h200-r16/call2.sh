#!/bin/bash
# r16 call 2: ext-dev = call 1's held-stage SwiGLU epilogues + the warp-per-row gather (combine.cuh);
# ext-base = 26b0773's kernels. The whole single-GPU suite on ext-dev, the S1 per-phase A/B, and
# ncu (full set, SASS source counters) of the BF16 dy Wd^T + SwiGLU-bwd kernel of S1 on ext-dev.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
use() { cp .device/ext-$1/_mok_c*.so jax_mok/; }
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
use dev
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 300 $PYTEST \
  tests/test_cuda_fp8.py tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py > $OUT/suite_fp8.log 2>&1 &
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 300 $PYTEST -m "gpu and not multigpu" \
  tests --ignore=tests/test_cuda_fp8.py --ignore=tests/test_cuda_fp8_weights.py \
  --ignore=tests/test_fp8_weights.py > $OUT/suite_rest.log 2>&1
wait
echo "suite fp8: $(tail -1 $OUT/suite_fp8.log)"; echo "suite rest: $(tail -1 $OUT/suite_rest.log) $(el)"
grep -E "^FAILED|^ERROR" $OUT/suite_fp8.log $OUT/suite_rest.log | head -20
for ext in base dev; do
  use $ext
  JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 60 python3 \
    tools/kernel_timings.py profile --shapes S1 --quantization none > $OUT/prof_${ext}_S1.txt 2>&1
  echo "profile $ext rc=$? $(el)"
done
python3 tools/kernel_timings.py compare $OUT/prof_base_S1.txt $OUT/prof_dev_S1.txt | grep -E "GEMM|gather|total"
use dev
mkdir -p /tmp/n
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 ncu --clock-control none --set full \
  --import-source no --kernel-name-base demangled -k "regex:Epi\)4" --launch-count 1 -f \
  -o /tmp/n/swiglu_bwd python3 tools/kernel_timings.py profile --shapes S1 --quantization none \
  > /tmp/n/ncu.log 2>&1
echo "ncu rc=$? $(el)"; tail -2 /tmp/n/ncu.log
ncu --import /tmp/n/swiglu_bwd.ncu-rep --print-details all > $OUT/ncu_details.txt 2>&1
ncu --import /tmp/n/swiglu_bwd.ncu-rep --page source --csv --print-source sass > /tmp/n/sass.csv 2>&1
gzip -c /tmp/n/sass.csv > $OUT/ncu_sass.csv.gz; ls -la $OUT/ncu_sass.csv.gz
grep -E "wgmma_gemm_kernel|^    Duration|Throughput|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued|Tensor" \
  $OUT/ncu_details.txt | cut -c1-150 | head -30
