#!/bin/bash
# The next session's second device call (written in r17), on the machine warm from
# next_call1.sh, carry [".device/ext-dev"]: r17 call 2's H/F sweep on main's kernels and its
# `kernel_timings fit` (the FP8 mainloops' per-stage share of the FP8 ceiling after 0a42b8b,
# against r17's 60-67 %: call2/fit.md), then the whole single-GPU suite on main's kernels.
export PYTHONPATH=$PWD
bash docs/bench/2026-12-03-h200-r17/call2.sh
python3 tools/kernel_timings.py fit $OUT/sweep_none.log $OUT/sweep_fp8_block.log | tee $OUT/fit.md
OUT=$OUT/suite EXT_DIR=.device/ext-dev SUITE_TIMEOUT=280 tools/gpu_round.sh suite \
  > $OUT/suite_round.log 2>&1
tail -4 $OUT/suite/summary.txt
