#!/bin/bash
# r29 call 2: why the pair build (2-CTA clusters, TMA multicast of B) runs the routed-M FP8 GEMMs
# ~2x slower (call 1). Prediction: the launch holds half the CTAs it should (grid = 2 x
# cudaOccupancyMaxActiveClusters < the SM count), which ncu's launch statistics show as a grid of
# ~66 on 132 SMs; else the grid is full and the pair protocol serializes (SM throughput halves).
# Then the BF16 routed-M pair GEMMs per phase (S1, S2) against main's kernels.
#   carry [".device/ext-m28", ".device/ext-pair"]
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
export PATH=/usr/local/cuda/bin:$PATH
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=".device/ext-pair" \
  AB_SHAPES=S1,S2 AB_QUANT=none tools/gpu_round.sh profab; keep profab16
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
for ext in ext-pair ext-m28; do
  cp .device/$ext/_mok_*.so jax_mok/ 2>/dev/null
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 ncu --clock-control none \
    --section LaunchStats --section Occupancy --section SpeedOfLight \
    -k "regex:fp8_gemm_kernel" --launch-count 2 python3 tools/kernel_timings.py forward \
    --shapes S1 --quantization fp8_block > $OUT/ncu_$ext.log 2>&1
  echo "== $ext rc=$?"
  grep -E "fp8_gemm_kernel|Duration|Grid Size|Cluster Size|Block Size|Waves Per SM|Registers Per|Dynamic Shared|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Theoretical Occ|Max Active Clusters|Cluster Scheduling" \
    $OUT/ncu_$ext.log | cut -c1-120 | head -40
done
