#!/bin/bash
# Call 2 (one nvidia-h200, ~6 min), carry [".device/ext-dev", ".device/ext-deep", ".device/ext-wq",
# ".whl"] (ext-wq optional):
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r24/call2.sh
# 1. ext-deep (the weight-gradient GEMMs stage a whole output tile, one ring stage fewer) and
#    ext-wq (the expert-weight quantizer) each bitwise against main's kernels (ext-dev), per phase
#    on S2, S1 in bf16 and fp8_block. Predicted (deep): S2 dWgu 8.5-9.8 -> ~5.5-6.5 ms, dWd
#    4.3-4.9 -> ~2.8-3.3; S1 dW within +-5 %.
# 2. The BF16 kernel tests on ext-deep (unit); the quantizer's GB/s and bit tests on ext-wq.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
DEV=".device/ext-deep"; [ -d .device/ext-wq ] && DEV="$DEV .device/ext-wq"
OUT=$OUT EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV="$DEV" AB_SHAPES=S2,S1,S6 \
  AB_QUANT="none fp8_block" tools/gpu_round.sh ab,profab,unit; keep ab
if [ -d .device/ext-wq ]; then
  OUT=$OUT EXT_DIR=.device/ext-dev tools/gpu_round.sh quant; keep quant_main
  OUT=$OUT EXT_DIR=.device/ext-wq tools/gpu_round.sh quant,fp8w; keep quant_wq
fi
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt * && find . -maxdepth 1 -type f ! -name summary_all.txt \
  ! -name call.tgz ! -name machine.txt -delete && find . -mindepth 1 -type d -exec rm -rf {} +
