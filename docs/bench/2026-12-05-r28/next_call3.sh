#!/bin/bash
# A third call (~8 min): the kernel tests on ext-ewg (its outputs are not bitwise main's: the
# oracle tests decide; test_cuda_fp8.py compares every output with the FP8 oracle,
# test_cuda_kernels.py the BF16 ones with the float64 one), then per phase on S4 (112 rows per
# expert: every routed-M tile a single, paired across experts) for ext-pair.
#   carry [".device/ext-m28", ".device/ext-pair", ".device/ext-epi", ".device/ext-ewg"]
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-05-r28/next_call3.sh
# Predictions: FP8 tests green on ext-ewg; S4 per GEMM within +-5 % (nothing shared, nothing idle;
# the two CTAs of a pair held in step).
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-ewg tools/gpu_round.sh fp8only,unit; keep tests
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=.device/ext-pair \
  AB_SHAPES=S4 AB_QUANT="none fp8_block" tools/gpu_round.sh profab; keep profab
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt --exclude="profab_*.txt" * && \
  find . -maxdepth 1 -type f ! -name summary_all.txt ! -name call.tgz ! -name machine.txt \
  ! -name "profab_*.txt" -delete; find . -mindepth 1 -type d -exec rm -rf {} +
