#!/bin/bash
# The next session's second call (warm machine, ~8 min), whatever call 1 showed short of a hang:
# the whole single-GPU suite on ext-pair, then per phase on S1 and S2 in bf16 for ext-pair (its
# BF16 routed-M pairs) and ext-ewg (the BF16 dy·Wd^T's epilogue warpgroup).
#   carry [".device/ext-m28", ".device/ext-pair", ".device/ext-epi", ".device/ext-ewg"]
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-05-r28/next_call2.sh
# Predictions: suite green (FP8 71 passed / 4 skipped, the rest 42 passed, as main at 2627361);
# pair: bf16 S2 gate/up -5..-10 %, S1 within +-5 %; ewg: bf16 dy·Wd^T S1 1.93 -> 1.2..1.5 ms,
# S2 4.8 -> 3.6..4.2 ms (its n128 halves may cost the mainloop a few %).
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-pair tools/gpu_round.sh suite; keep suite
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=".device/ext-pair .device/ext-ewg" \
  AB_SHAPES=S1,S2 AB_QUANT=none tools/gpu_round.sh profab; keep profab16
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt --exclude="profab_*.txt" * && \
  find . -maxdepth 1 -type f ! -name summary_all.txt ! -name call.tgz ! -name machine.txt \
  ! -name "profab_*.txt" -delete; find . -mindepth 1 -type d -exec rm -rf {} +
