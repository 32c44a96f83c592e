#!/bin/bash
# A third call if the budget allows (~5 min): the FP8 tests and the fp8_weights tests on ext-epi
# (its dh_q comes from the fused epilogue, the down / dh·Wgu^T rows from TMA stores;
# test_cuda_fp8.py compares every output with the FP8 oracle), then per phase S3 and S6 for
# ext-pair.
#   carry [".device/ext-m28", ".device/ext-pair", ".device/ext-epi", ".whl"]
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-05-r28/next_call3.sh
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-epi tools/gpu_round.sh fp8; keep fp8
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=.device/ext-pair \
  AB_SHAPES=S3,S6 AB_QUANT="none fp8_block" tools/gpu_round.sh profab; keep profab
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt --exclude="profab_*.txt" * && \
  find . -maxdepth 1 -type f ! -name summary_all.txt ! -name call.tgz ! -name machine.txt \
  ! -name "profab_*.txt" -delete; find . -mindepth 1 -type d -exec rm -rf {} +
