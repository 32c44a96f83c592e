#!/bin/bash
# Call 3 (one nvidia-h200, ~5 min), carry [".device/ext-main", ".device/ext-ord", ".whl"]:
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r25/call3.sh
# ext-main = main's kernels (48662d3); ext-ord = + wg_order.patch: the two FP8 consumer
# warpgroups issue their wgmma groups in turn (named barriers 5/6). Predicted: FP8 routed-M GEMMs
# -10..-20 %, the weight gradients (FP8 only with fp8_weight_gradients) likewise; bitwise equal.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-main AB_BASE=.device/ext-main AB_DEV=.device/ext-ord AB_SHAPES=S2,S1 \
  AB_QUANT="fp8_block mxfp8" tools/gpu_round.sh ab,profab,fp8; keep ab
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt * && find . -maxdepth 1 -type f ! -name summary_all.txt \
  ! -name call.tgz ! -name machine.txt -name "*.txt" ! -name "profab*" -delete; \
  find . -maxdepth 1 -name "*.tgz" ! -name call.tgz -delete; find . -mindepth 1 -type d -exec rm -rf {} +
