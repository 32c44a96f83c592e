#!/bin/bash
# The next session's first call (one nvidia-h200, ~8 min), carry [".device/ext-dev",
# ".device/ext-l2", ".device/ext-m256", ".whl"]:
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r23/next_call1.sh
# 1. traffic: where S2's FP8 forward GEMMs re-read (DRAM bytes, L2 read misses from the SMs'
#    loads against all misses; TMA's are the difference), FP8 and BF16 side by side (main).
# 2. l2_policy.patch (ext-l2): L2 evict_last on the FP8 routed GEMMs' weight boxes (1), A rows
#    (2), both (3), set by MOK_EXP_FP8_L2_POLICY (candidate-only; 0 = main's code path): the
#    per-phase profile of S2 and S1 fp8_block for each against 0, and the traffic counters of
#    S2 at 1 and 2. Cache hints cannot change a value (no bitwise step needed).
# 3. m256.patch (ext-m256): bitwise against main's kernels (226 outputs), per phase, FP8 tests.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
OUT=$OUT EXT_DIR=.device/ext-dev tools/gpu_round.sh traffic
(cd $OUT && mv logs.tgz logs_traffic.tgz && mv summary.txt summary_traffic.txt)
cp .device/ext-l2/_mok_c*.so jax_mok/
for v in 0 1 2 3; do
  MOK_EXP_FP8_L2_POLICY=$v JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 \
    PYTHONPATH=$PWD timeout 100 python3 tools/kernel_timings.py profile --shapes S2,S1 \
    --quantization fp8_block > $OUT/l2prof_$v.log 2>&1
  echo "policy $v: profile rc=$?"
done
for v in 1 2 3; do
  echo "== L2 policy $v against 0"
  python3 tools/kernel_timings.py compare $OUT/l2prof_0.log $OUT/l2prof_$v.log \
    | tee $OUT/l2profab_$v.txt | grep -E "fp8 .*GEMM|total"
done
m=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_read.sum
m=$m,lts__t_sectors_op_read_lookup_miss.sum,lts__t_sectors_srcunit_tex_op_read.sum
m=$m,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,gpu__time_duration.sum
for v in 1 2; do
  MOK_EXP_FP8_L2_POLICY=$v XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD timeout 90 \
    ncu --clock-control none --metrics "$m" -k regex:fp8_gemm_kernel --launch-count 2 \
    python3 tools/kernel_timings.py forward --shapes S2 --quantization fp8_block \
    > $OUT/l2traffic_$v.log 2>&1
  echo "== traffic at L2 policy $v"; grep -E "_gemm_kernel|dram__|lts__|gpu__time" \
    $OUT/l2traffic_$v.log | cut -c1-120
done
OUT=$OUT EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV=.device/ext-m256 \
  AB_SHAPES=S2,S1 AB_QUANT="fp8_block mxfp8" tools/gpu_round.sh ab,profab,fp8
# at most 8 files come back: the L2 experiment's logs and tables leave as one archive
(cd $OUT && tar czf l2_all.tgz l2prof* l2traffic* && rm -f l2prof* l2traffic*)
