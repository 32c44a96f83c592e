#!/bin/bash
# r16 call 3 (the session's last): ext-dev = the working tree: (a) the staged SwiGLU epilogues
# addressing shared memory by 32-bit offsets (FragOffsets; call 2's ncu: address arithmetic was
# ~35 % of the dy Wd^T epilogue's instructions), (b) the BF16 kernel's plain row outputs (down,
# dh Wgu^T, dW) stored by TMA from the staging buffer (store_rows_tma); ext-head = 14ade77 (call
# 2's kernels); ext-base = 26b0773.
#   a/: ext-dev against ext-base bitwise, and their S1, S2 bf16 per-phase profiles;
#   b/: the whole single-GPU suite and the timings table on ext-dev if it was bitwise equal to
#       ext-base, else on ext-head.
mkdir -p $OUT/a $OUT/b
OUT=$OUT/a EXT_DIR=.device/ext-dev AB_SHAPES=S1,S2 AB_QUANT=none PROFILE_TIMEOUT=90 \
  tools/gpu_round.sh ab,profab > $OUT/a/round.log 2>&1
tail -25 $OUT/a/round.log
ext=.device/ext-dev
grep -q "ab_compare: rc=0" $OUT/a/summary.txt || ext=.device/ext-head
echo "suite and timings on $ext"
OUT=$OUT/b EXT_DIR=$ext TIMING_SHAPES=S1,S2,S3,S6 TIMING_QUANT=none,fp8_block \
  TIMING_FP8_RUNS=fwd,fwdbwd,fwdbwd_prep TIMING_WGRAD=unquantized TIMING_TIMEOUT=200 \
  PROFILE_SHAPES=none SUITE_TIMEOUT=260 tools/gpu_round.sh suite,timings > $OUT/b/round.log 2>&1
grep -E "^\| S[0-9]|ceiling" $OUT/b/timings.log | cut -c1-200
tail -6 $OUT/b/summary.txt
