#!/bin/bash
# The next session's first device call (written in r19), carry [".device/ext-dev",
# ".device/ext-prod", ".device/ext-x1p"] (~32 MB): r19's candidate `producers.patch` (both
# gathered producers make their chunk sources once per tile; ext-prod) bitwise and per phase
# against main's kernels (ext-dev), and ext-x1p (x1's no-promotion consumer with the new
# producer, timing only: how far the feed alone goes). Then the whole suite on ext-prod if it is
# bitwise equal (the patch then goes to main). Each step has its own OUT folder: gpu_round.sh
# tars and deletes every *.log in its OUT at its end.
# Predicted (r19 perf-notes): ext-prod fp8_block GEMM phases -15 to -30 %, BF16 gathered phases
# (gate/up, dy Wd^T) -0 to -10 %, bitwise equal; ext-x1p -30 to -40 %.
# Returns summary.txt, profab_all.md, rest.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/ab $OUT/prof $OUT/mx $OUT/suite
OUT=$OUT/ab EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV=.device/ext-prod \
  tools/gpu_round.sh ab > $OUT/ab_round.txt 2>&1
grep -h "bitwise\|differ" $OUT/ab_round.txt | tail -3 | tee $OUT/summary.txt
OUT=$OUT/prof EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev \
  AB_DEV=".device/ext-prod .device/ext-x1p" AB_SHAPES=S1,S2 AB_QUANT="none fp8_block" \
  PROFILE_TIMEOUT=90 tools/gpu_round.sh profab > $OUT/prof_round.txt 2>&1
OUT=$OUT/mx EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV=.device/ext-prod \
  AB_SHAPES=S1,S2 AB_QUANT=mxfp8 PROFILE_TIMEOUT=90 tools/gpu_round.sh profab \
  > $OUT/mx_round.txt 2>&1
(cd $OUT && for f in prof/profab_*.txt mx/profab_*.txt; do echo "## $f"; cat "$f"; done \
  > profab_all.md)
grep -hE "^## |GEMM|total" $OUT/profab_all.md | tee -a $OUT/summary.txt
if grep -qE "\b([0-9]+) of \1 outputs bitwise equal" $OUT/ab_round.txt; then
  OUT=$OUT/suite EXT_DIR=.device/ext-prod SUITE_TIMEOUT=240 tools/gpu_round.sh suite \
    > $OUT/suite_round.txt 2>&1
  tail -3 $OUT/suite/summary.txt | tee -a $OUT/summary.txt
fi
(cd $OUT && tar czf rest.tgz ab prof mx suite ab_round.txt prof_round.txt mx_round.txt \
  suite_round.txt 2>/dev/null; rm -rf ab prof mx suite *_round.txt)
ls $OUT; echo "done at ${SECONDS}s"
