#!/bin/bash
# The next session's first call (one nvidia-h200, ~8 min), carry [".device/ext-dev",
# ".device/ext-dyn", ".device/ext-m256", ".whl"]:
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r23/next_call1.sh
# 1. traffic: S2's forward GEMMs' DRAM bytes and L2 misses by source unit, FP8 and BF16 (main).
# 2. dyn_schedule.patch (ext-dyn): the FP8 routed-M GEMMs take their tiles in order from a
#    counter (MOK_EXP_FP8_DYNAMIC=1; unset = main's static order) so that the m-tiles of one
#    expert's n-tile run together and share its weight boxes through L2. Bitwise against main's
#    kernels (226 outputs), per phase S2 + S1 fp8_block against the static order, and the
#    traffic counters of S2 with it. Predicted: S2 gate/up 4.7 → ~3.2 ms, down 2.4 → ~1.8 ms,
#    dy·Wdᵀ and dh·Wguᵀ −15..−30 %; S1 ±3 % (16 m-tiles per expert already share).
# 3. m256.patch (ext-m256): bitwise against main's kernels, per phase, the FP8 tests.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH XLA_PYTHON_CLIENT_MEM_FRACTION=0.85
OUT=$OUT EXT_DIR=.device/ext-dev tools/gpu_round.sh traffic
(cd $OUT && mv logs.tgz logs_traffic.tgz && mv summary.txt summary_traffic.txt)
cp .device/ext-dev/_mok_c*.so jax_mok/
PYTHONPATH=$PWD timeout 150 python3 tools/compare_builds.py run /tmp/dev.npz > $OUT/dyn_ab_base.log 2>&1
cp .device/ext-dyn/_mok_c*.so jax_mok/
MOK_EXP_FP8_DYNAMIC=1 PYTHONPATH=$PWD timeout 150 python3 tools/compare_builds.py run /tmp/dyn.npz \
  > $OUT/dyn_ab.log 2>&1
echo "dyn bitwise: $(python3 tools/compare_builds.py compare /tmp/dev.npz /tmp/dyn.npz 2>&1 | tail -1)"
for v in 0 1; do
  MOK_EXP_FP8_DYNAMIC=$v JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD timeout 100 python3 \
    tools/kernel_timings.py profile --shapes S2,S1 --quantization fp8_block > $OUT/dynprof_$v.log 2>&1
  echo "dynamic $v: profile rc=$?"
done
python3 tools/kernel_timings.py compare $OUT/dynprof_0.log $OUT/dynprof_1.log \
  | tee $OUT/dynprofab.txt | grep -E "fp8 .*GEMM|total"
m=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_read.sum
m=$m,lts__t_sectors_op_read_lookup_miss.sum,lts__t_sectors_srcunit_tex_op_read.sum
m=$m,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,gpu__time_duration.sum
MOK_EXP_FP8_DYNAMIC=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD timeout 90 ncu \
  --clock-control none --metrics "$m" -k regex:fp8_gemm_kernel --launch-count 2 python3 \
  tools/kernel_timings.py forward --shapes S2 --quantization fp8_block > $OUT/dyntraffic.log 2>&1
echo "== traffic, dynamic order"; grep -E "_gemm_kernel|dram__|lts__|gpu__time" $OUT/dyntraffic.log \
  | cut -c1-120
# at most 8 files come back: the dynamic order's logs and table leave as one archive
(cd $OUT && tar czf dyn_all.tgz dyn* && rm -f dyn*.log dynprofab.txt)
OUT=$OUT EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV=.device/ext-m256 \
  AB_SHAPES=S2,S1 AB_QUANT="fp8_block mxfp8" tools/gpu_round.sh ab,profab,fp8
