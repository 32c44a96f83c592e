#!/bin/bash
# The next session's first device call (written in r19), carry [".device/ext-dev",
# ".device/ext-prod", ".device/ext-tmaa"] (~33 MB). Candidates (patches beside this script, not
# on main): ext-prod = producers.patch (both gathered producers make their chunk sources once
# per tile); ext-tmaa = producers.patch + fp8_tma_a.patch (the FP8 GEMMs whose A is in row
# order — forward down, dh Wgu^T, FP8 weight gradients — load A by TMA, one thread per stage).
# Both must be bitwise equal to main's kernels (ext-dev): same products, same order. Then per
# phase against ext-dev, and the whole suite on the largest candidate that is bitwise equal (its
# patches then go to main: `git apply` them in order, rebuild, commit).
# Each step has its own OUT folder: gpu_round.sh tars and deletes every *.log in its OUT.
# Predicted (r19 perf-notes): fp8_block GEMM phases -15 to -30 % (ext-prod), the down and dh
# Wgu^T phases a further -5 to -15 % (ext-tmaa); BF16 gathered phases (gate/up, dy Wd^T) -0 to
# -10 %. ext-x1p (x1 + the new producer, timing only) is left for a later call.
# Returns summary.txt, profab_all.md, rest.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/ab $OUT/prof $OUT/mx $OUT/suite
OUT=$OUT/ab EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev \
  AB_DEV=".device/ext-prod .device/ext-tmaa" tools/gpu_round.sh ab > $OUT/ab_round.txt 2>&1
grep -hE "ab_compare|bitwise|differ" $OUT/ab_round.txt | tail -6 | tee $OUT/summary.txt
OUT=$OUT/prof EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev \
  AB_DEV=".device/ext-prod .device/ext-tmaa" AB_SHAPES=S1,S2 AB_QUANT="none fp8_block" \
  PROFILE_TIMEOUT=90 tools/gpu_round.sh profab > $OUT/prof_round.txt 2>&1
OUT=$OUT/mx EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV=.device/ext-tmaa \
  AB_SHAPES=S1,S2 AB_QUANT=mxfp8 PROFILE_TIMEOUT=90 tools/gpu_round.sh profab \
  > $OUT/mx_round.txt 2>&1
(cd $OUT && for f in prof/profab_*.txt mx/profab_*.txt; do echo "## $f"; cat "$f"; done \
  > profab_all.md)
grep -hE "^## |GEMM|total" $OUT/profab_all.md | tee -a $OUT/summary.txt
# compare_builds exits 0 only when every output is bitwise equal (gpu_round.sh notes its rc)
equal() { grep -q "ab_compare_$1: rc=0 " $OUT/ab_round.txt; }
suite_ext=""
if equal ext-tmaa; then suite_ext=.device/ext-tmaa; elif equal ext-prod; then suite_ext=.device/ext-prod; fi
echo "suite on: ${suite_ext:-none (no candidate bitwise equal)}" | tee -a $OUT/summary.txt
if [ -n "$suite_ext" ]; then
  OUT=$OUT/suite EXT_DIR=$suite_ext SUITE_TIMEOUT=240 tools/gpu_round.sh suite \
    > $OUT/suite_round.txt 2>&1
  tail -3 $OUT/suite/summary.txt | tee -a $OUT/summary.txt
fi
(cd $OUT && tar czf rest.tgz ab prof mx suite ab_round.txt prof_round.txt mx_round.txt \
  suite_round.txt 2>/dev/null; rm -rf ab prof mx suite *_round.txt)
ls $OUT; echo "done at ${SECONDS}s"
