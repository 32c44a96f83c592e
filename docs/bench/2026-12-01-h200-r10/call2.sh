#!/bin/bash
# Call 2: why the 2-CTA clusters lost (ncu of S2's prepared-weight FP8 GEMMs, cluster 2 vs 1), S4's
# FP8 forward+backward in a fresh process (the saved-h backward no longer keeps the forward gate/up
# layout), the per-phase profiles (cluster 1), the compile times.
set -uo pipefail
export PYTHONUNBUFFERED=1 JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-unknown} PATH=/usr/local/cuda/bin:$PATH
cp .device/ext/_mok_c*.so jax_mok/ && export PYTHONPATH=$PWD
t=$(date +%s)
for c in 2 1; do
  JAX_MOK_CUDA_FP8_CLUSTER=$c timeout 100 ncu --clock-control none -k regex:fp8_gemm -c 2 \
    --section SpeedOfLight --section LaunchStats --section Occupancy \
    python3 tools/kernel_timings.py forward --shapes S2 --quantization fp8_block > $OUT/ncu_c$c.log 2>&1
  echo "ncu cluster $c rc=$?"
  grep -E "fp8_gemm_kernel|Duration|L2 Cache Throughput|DRAM Throughput|Compute \(SM\)|Grid Size|Cluster Size|Waves|Max Active Clusters" $OUT/ncu_c$c.log | head -24
done
echo "ncu: $(( $(date +%s) - t )) s"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 JAX_MOK_CUDA_FP8_CLUSTER=1 timeout 120 python3 tools/kernel_timings.py timings \
  --shapes S4 --quantization fp8_block --fp8-runs fwdbwd > $OUT/s4.log 2>&1; echo "s4 rc=$?"
grep -E "^S4|failed|Out of memory" $OUT/s4.log | cut -c1-250 | head
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 JAX_MOK_CUDA_FP8_CLUSTER=1
JAX_MOK_CUDA_PROFILE=1 timeout 90 python3 tools/kernel_timings.py profile --shapes S1,S2,S3 \
  --quantization fp8_block > $OUT/profile_fp8.log 2>&1; echo "profile fp8 rc=$?"
JAX_MOK_CUDA_PROFILE=1 timeout 60 python3 tools/kernel_timings.py profile --shapes S1,S2 \
  > $OUT/profile_bf16.log 2>&1; echo "profile bf16 rc=$?"
timeout 100 python3 tools/kernel_timings.py compile --shapes S1,S2 --quantization none,fp8_block \
  > $OUT/compile.log 2>&1; echo "compile rc=$?"; cat $OUT/compile.log | grep "^|"
echo "total: $(( $(date +%s) - t )) s"
