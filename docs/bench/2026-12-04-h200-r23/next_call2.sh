#!/bin/bash
# The next session's second call (~4 min), carry [".device/ext-l2", ".whl"]: l2_policy.patch,
# L2 evict_last on the FP8 routed GEMMs' weight boxes (1), A rows (2), both (3), chosen by
# MOK_EXP_FP8_L2_POLICY (0 = main's path); per phase S2 + S1 fp8_block against 0, and the
# traffic counters of S2 at 1 and 2. Cache hints cannot change a value (no bitwise step).
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r23/next_call2.sh
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH XLA_PYTHON_CLIENT_MEM_FRACTION=0.85
cp .device/ext-l2/_mok_c*.so jax_mok/
for v in 0 1 2 3; do
  MOK_EXP_FP8_L2_POLICY=$v JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD timeout 100 python3 \
    tools/kernel_timings.py profile --shapes S2,S1 --quantization fp8_block > $OUT/l2prof_$v.log 2>&1
  echo "policy $v: profile rc=$?"
done
for v in 1 2 3; do
  echo "== L2 policy $v against 0"
  python3 tools/kernel_timings.py compare $OUT/l2prof_0.log $OUT/l2prof_$v.log \
    | tee $OUT/l2profab_$v.txt | grep -E "fp8 .*GEMM|total"
done
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
for v in 1 2; do  # gpu_round.sh's counters; the switch passes through the environment
  MOK_EXP_FP8_L2_POLICY=$v OUT=$OUT EXT_DIR=.device/ext-l2 TRAFFIC_RECIPES=fp8_block \
    tools/gpu_round.sh traffic; keep traffic_l2_$v
done
(cd $OUT && tar czf l2_all.tgz l2prof* && rm -f l2prof*)
