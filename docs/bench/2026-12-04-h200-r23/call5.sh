#!/bin/bash
# r23 call 5 (one nvidia-h200, carry [".device/ext-pair"]): pair_lag.patch's build, the FP8
# routed-M GEMMs in 2-CTA clusters whose paired m-tiles issue each weight box within
# JAX_MOK_FP8_PAIR_LAG k-blocks of each other (call 4's ncu: S2's gate/up GEMM read 17 GB from
# DRAM for 7.5 GB of FP8 weights, L2 at 93 %).
#   OUT=$OUT bash docs/bench/2026-12-04-h200-r23/call5.sh
# For each lag (off = one-CTA launches, as main): the 226 outputs of tools/compare_builds.py
# against off's (bitwise), the per-phase profile of S2 and S1 fp8_block; last, ncu of S2's FP8
# forward GEMMs at lag 2.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 PATH=/usr/local/cuda/bin:$PATH
cp .device/ext-pair/_mok_c*.so jax_mok/ && export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv,noheader > $OUT/machine.txt
echo "commit ${JAX_MOK_GIT_COMMIT:-?} + pair_lag.patch" >> $OUT/machine.txt
LAGS="off 2 1000000"
for v in $LAGS; do
  if [ $v = off ]; then unset JAX_MOK_FP8_PAIR_LAG; else export JAX_MOK_FP8_PAIR_LAG=$v; fi
  t=$(date +%s)
  timeout 120 python3 tools/compare_builds.py run /tmp/ab_$v.npz > $OUT/ab_$v.log 2>&1
  echo "lag $v: ab rc=$? ($(( $(date +%s) - t )) s)"
  [ $v = off ] || python3 tools/compare_builds.py compare /tmp/ab_off.npz /tmp/ab_$v.npz 2>&1 \
    | tail -1
  JAX_MOK_CUDA_PROFILE=1 timeout 100 python3 tools/kernel_timings.py profile --shapes S2,S1 \
    --quantization fp8_block > $OUT/prof_$v.log 2>&1
  echo "lag $v: profile rc=$? ($(( $(date +%s) - t )) s total)"
done
unset JAX_MOK_FP8_PAIR_LAG
for v in $LAGS; do
  [ $v = off ] && continue
  python3 tools/kernel_timings.py compare $OUT/prof_off.log $OUT/prof_$v.log > $OUT/profab_$v.txt
  echo "== lag $v against off"; grep -E "fp8 .*GEMM|total" $OUT/profab_$v.txt
done
JAX_MOK_FP8_PAIR_LAG=2 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 60 ncu --clock-control none \
  --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:fp8_gemm_kernel \
  --launch-count 2 python3 tools/kernel_timings.py forward --shapes S2 --quantization fp8_block \
  > $OUT/ncu_lag2.log 2>&1
grep -E "fp8_gemm_kernel|Duration|DRAM Throughput|L2 Cache Throughput|Memory Throughput|L2 Hit" \
  $OUT/ncu_lag2.log | cut -c1-120
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
