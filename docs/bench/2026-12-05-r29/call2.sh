#!/bin/bash
# r29 call 2 (~6 min): the mxfp8-through-BF16 build (ext-mx: CMake JAX_MOK_MX_BF16=1) on the GPU
# for the first time, and why the pair build runs the routed-M FP8 GEMMs ~2x slower (call 1).
#   carry [".device/ext-m28", ".device/ext-pair", ".device/ext-mx"]
#   OUT=$OUT bash docs/bench/2026-12-05-r29/call2.sh
# 1. tests/test_cuda_fp8.py on ext-mx (the mxfp8 kernels against the float64 oracle of the
#    dequantized operands). Prediction: green (the conversion and the slots' layout are checked
#    on the CPU: tests/test_mx_bf16.py); a hang shows as the 150 s timeout.
# 2. per phase, mxfp8, S1 and S2: ext-m28 (promoted FP8 wgmma) against ext-mx. Prediction: each
#    mxfp8 GEMM near the BF16 kernel's time for the phase (within ~10 %): S1 gate/up ~2.0 ms
#    against m28's ~3.5, S2's ~5 against ~8 (the promotion gone; the conversion, ~140 instructions
#    a thread per 32-K step, runs under the previous step's wgmmas).
# 3. ncu launch statistics of the pair build's first two FP8 GEMMs (S1 forward) against m28's.
#    Prediction: the pair launch holds half the CTAs it should (a grid of ~66 on 132 SMs:
#    2 x cudaOccupancyMaxActiveClusters below the SM count); else the grid is full and the pair
#    protocol serializes the two CTAs (the SM throughput halves).
# 4. per phase, bf16, S1 and S2: the BF16 routed-M pair GEMMs against m28's.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
export PATH=/usr/local/cuda/bin:$PATH
OUT=$OUT EXT_DIR=.device/ext-mx FP8_TIMEOUT=150 tools/gpu_round.sh fp8only; keep mxtests
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=".device/ext-mx" \
  AB_SHAPES=S1,S2 AB_QUANT=mxfp8 PROFILE_TIMEOUT=90 tools/gpu_round.sh profab; keep profabmx
for ext in ext-pair ext-m28; do
  cp .device/$ext/_mok_*.so jax_mok/
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 100 ncu --clock-control none \
    --section LaunchStats --section Occupancy --section SpeedOfLight \
    -k "regex:fp8_gemm_kernel" --launch-count 2 python3 tools/kernel_timings.py forward \
    --shapes S1 --quantization fp8_block > $OUT/ncu_$ext.log 2>&1
  echo "== $ext rc=$?"
  grep -E "fp8_gemm_kernel|Duration|Grid Size|Cluster Size|Block Size|Waves Per SM|Registers Per|Dynamic Shared|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Theoretical Occ|Max Active Clusters|Cluster Scheduling" \
    $OUT/ncu_$ext.log | cut -c1-120 | head -40
done
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=".device/ext-pair" \
  AB_SHAPES=S1,S2 AB_QUANT=none PROFILE_TIMEOUT=90 tools/gpu_round.sh profab; keep profab16
