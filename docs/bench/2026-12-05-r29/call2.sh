#!/bin/bash
# r29 call 2 (~4 min; the session had ~370 s of device time left): the mxfp8-through-BF16 build
# (ext-mx: CMake JAX_MOK_MX_BF16=1) on the GPU for the first time, and the pair build's launch.
#   carry [".device/ext-m28", ".device/ext-pair", ".device/ext-mx"]
#   OUT=$OUT bash docs/bench/2026-12-05-r29/call2.sh
# 1. tests/test_cuda_fp8.py -k mxfp8 on ext-mx (the mxfp8 layer against the float64 oracle of the
#    dequantized operands). Prediction: green (the conversion and the slots' layout are checked
#    on the CPU: tests/test_mx_bf16.py); a hang shows as the timeout.
# 2. per phase, S1 and S2: mxfp8 on ext-m28 (promoted FP8 wgmma) and on ext-mx, bf16 on ext-m28.
#    Prediction: each ext-mx mxfp8 GEMM at 1.0-1.25x the BF16 kernel's time for its phase, where
#    m28's mxfp8 GEMMs take ~1.6-2x BF16's (the promotion gone; the conversion, ~190 SASS
#    instructions a thread per 32-K step, ~72 % of the issue slots, runs under the wgmmas).
# 3. ncu launch statistics of the pair build's first two FP8 GEMMs (S1 forward; and
#    launch_clusters' stderr line if the grid is short of the SMs). Prediction: a
#    grid of half the SMs (2 x cudaOccupancyMaxActiveClusters below the SM count); else the grid
#    is full and the two CTAs of a pair take turns (SM throughput halves).
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee $OUT/machine.txt
use() { cp .device/$1/_mok_c*.so jax_mok/ && echo "ext $1 $(md5sum jax_mok/_mok_cuda*.so | cut -c1-8)"; }
use ext-mx
JAX_MOK_REQUIRE_CUDA=1 timeout 110 python3 -m pytest -q -x -p no:cacheprovider -rfE \
  tests/test_cuda_fp8.py -k mxfp8 > $OUT/mx_tests.log 2>&1; echo "mx tests rc=$?"
tail -5 $OUT/mx_tests.log
prof() {  # ext quantization
  use $1 > /dev/null
  JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 60 python3 \
    tools/kernel_timings.py profile --shapes S1,S2 --quantization $2 > $OUT/prof_$1_$2.log 2>&1
  echo "prof $1 $2 rc=$?"
}
prof ext-mx mxfp8
prof ext-m28 mxfp8
prof ext-m28 none
python3 tools/kernel_timings.py compare $OUT/prof_ext-m28_mxfp8.log $OUT/prof_ext-mx_mxfp8.log \
  | grep -E "GEMM|total"
python3 tools/kernel_timings.py compare $OUT/prof_ext-m28_none.log $OUT/prof_ext-mx_mxfp8.log \
  | grep -E "GEMM|total"
use ext-pair
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 70 ncu --clock-control none --section LaunchStats \
  --section SpeedOfLight -k "regex:fp8_gemm_kernel" --launch-count 2 python3 \
  tools/kernel_timings.py forward --shapes S1 --quantization fp8_block > $OUT/ncu_pair.log 2>&1
echo "ncu rc=$?"
grep -E "fp8_gemm_kernel|Duration|Grid Size|Cluster Size|Block Size|Waves Per SM|Compute \(SM\) Throughput|Memory Throughput" \
  $OUT/ncu_pair.log | cut -c1-110 | head -24
grep -h "cluster launch holds" $OUT/ncu_pair.log | head -2  # launch_clusters' one-time line
