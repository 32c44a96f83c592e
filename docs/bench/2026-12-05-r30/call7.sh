#!/bin/bash
# r30 call 7 (~4 min): the weight quantizer's transposed (along-A) layout staged in shared memory
# and stored as whole 128-byte rows (ext-q) against main (ext-main).
#   carry [".device/ext-main", ".device/ext-q"]   OUT=$OUT bash docs/bench/2026-12-05-r30/call7.sh
# Call 6 (ncu, S1 w_gate_up, both layouts, fp8_block): DRAM 78 %, SM-to-L2 crossbar 82 % busy,
# issue slots 65 %: each warp's along-A store wrote 16-byte pieces of 32 rows.
# Predictions: the quantizer bit tests pass (same bytes, other stores); "weights, both layouts"
# 77 % -> 82..88 % of the copy (fp8_block and mxfp8), the forward layout likewise, x rows unchanged.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-q JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-} FP8W_TIMEOUT=150 \
  QUANT_SHAPES=S1,S2 tools/gpu_round.sh fp8w,quant; keep q
OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-} \
  QUANT_SHAPES=S1,S2 tools/gpu_round.sh quant; keep main
