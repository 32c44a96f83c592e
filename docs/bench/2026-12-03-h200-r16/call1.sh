#!/bin/bash
# r16 call 1: ext-base = 26b0773's kernels, ext-dev = the SwiGLU epilogues through the held ring
# stage (ffi/cuda/device/epilogue_staged.cuh). Bitwise A/B of the two builds first (a hang or a
# wrong bit shows there), then per-phase profiles of both, BF16 and fp8_block, S1 and S2.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
use() { cp .device/ext-$1/_mok_c*.so jax_mok/; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
for ext in dev base; do
  use $ext
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 150 python3 tools/compare_builds.py run \
    /tmp/ab_$ext.npz > $OUT/ab_$ext.log 2>&1
  echo "ab $ext rc=$? $(el) $(tail -1 $OUT/ab_$ext.log)"
done
python3 tools/compare_builds.py compare /tmp/ab_base.npz /tmp/ab_dev.npz > $OUT/ab_compare.txt 2>&1
echo "compare rc=$?"; tail -12 $OUT/ab_compare.txt
for q in none fp8_block; do
  for ext in base dev; do
    use $ext
    JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 80 python3 \
      tools/kernel_timings.py profile --shapes S1,S2 --quantization $q > $OUT/prof_${ext}_$q.txt 2>&1
    echo "profile $ext $q rc=$? $(el)"
  done
  python3 tools/kernel_timings.py compare $OUT/prof_base_$q.txt $OUT/prof_dev_$q.txt 2>&1 \
    | grep -E "GEMM|total|S[0-9]"
done
