#!/bin/bash
# Call 1 (one nvidia-h200, ~7 min), carry [".device/ext-bdyn", ".device/ext-q", ".device/ext-qr",
# ".whl"]:
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r26/call1.sh
# ext-bdyn = main's kernels (48662d3..aa90ff1). ext-q = + the FP8 consumers' quarter groups
# (n64 wgmma groups in two 32-float part tiles; group n + 1 issued before group n is promoted,
# the stage's last group promoted alone). ext-qr = ext-q + the BF16 routed-K ring back to 4
# stages with per-pass (8 KB) output staging instead of 3 + whole-tile staging.
# Predicted: FP8 routed-M GEMMs (fp8_block) -10..-20 % if n64 SS wgmmas keep the tensor pipe's
# rate (A is read from shared memory twice as often), mxfp8 -15..-30 %; bitwise equal. BF16 S2
# dW -5..-10 % (qr), others unchanged.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-bdyn AB_BASE=.device/ext-bdyn AB_DEV=".device/ext-qr .device/ext-q" \
  AB_SHAPES=S2,S1 AB_QUANT="fp8_block none mxfp8" tools/gpu_round.sh ab,profab,fp8,unit; keep ab
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt * && find . -maxdepth 1 -type f ! -name summary_all.txt \
  ! -name call.tgz ! -name machine.txt -name "*.txt" ! -name "profab*" -delete; \
  find . -maxdepth 1 -name "*.tgz" ! -name call.tgz -delete; find . -mindepth 1 -type d -exec rm -rf {} +
