#!/bin/bash
# r30 call 4 (~4 min): pairs scheduled expert by expert (ext-pair3) against main's kernels.
#   carry [".device/ext-m28", ".device/ext-pair3"]
#   OUT=$OUT bash docs/bench/2026-12-05-r30/call4.sh
# Call 3 (ncu, S2 fp8_block gate/up): ext-pair2 cut the L2's sector traffic ~19 % (B multicast)
# but read ~1.4x m28's bytes from DRAM: its single m-tiles (an expert's odd last one: about half of
# S2's experts have 3 m-tiles) ran after every shared pair, paired across experts, so their weight
# tiles came from DRAM a second time. ext-pair3 pairs an expert's singles on n-tiles 2g, 2g + 1
# right after that expert's shared pairs (cluster.cuh).
# Predictions: 226/226 bitwise equal; S2 routed-M GEMMs (fp8_block and bf16) -3..-10 % against
# m28 (the DRAM excess gone, the L2 saving kept); S1 -3..+3 %; S3 (16 pairs per expert, no
# singles) -5..+5 %; S6 -3..+5 %.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=".device/ext-pair3" \
  tools/gpu_round.sh ab; keep ab
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=".device/ext-pair3" \
  AB_SHAPES=S1,S2,S3,S6 tools/gpu_round.sh profab; keep profab
