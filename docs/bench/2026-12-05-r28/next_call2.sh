#!/bin/bash
# The next session's second call (warm machine, ~7 min), whatever call 1 showed short of a hang
# or a bitwise difference: the whole single-GPU suite on the pair build (FP8 tests on ext-epi:
# next_call3.sh if the budget allows), then per phase on S4,
# whose experts have one m-tile each (112 rows per expert): every tile is a single, paired with
# another expert's, each CTA loading its own B and the two held in step stage by stage: the
# cost of pairs where they share nothing. S3 and S6 after it if the budget allows
# (AB_SHAPES=S3,S6, a third call).
#   carry [".device/ext-m28", ".device/ext-pair", ".device/ext-epi", ".whl"]
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-05-r28/next_call2.sh
# Predictions: suite green (FP8 71 passed / 4 skipped, the rest 42 passed, as main at 2627361);
# S4 fp8_block and bf16 per GEMM within +-5 % (nothing shared, nothing idle; the lockstep costs
# the slower CTA of each pair per stage).
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-pair tools/gpu_round.sh suite; keep suite
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=.device/ext-pair \
  AB_SHAPES=S4 AB_QUANT="none fp8_block" tools/gpu_round.sh profab; keep profab
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt --exclude="profab_*.txt" * && \
  find . -maxdepth 1 -type f ! -name summary_all.txt ! -name call.tgz ! -name machine.txt \
  ! -name "profab_*.txt" -delete; find . -mindepth 1 -type d -exec rm -rf {} +
