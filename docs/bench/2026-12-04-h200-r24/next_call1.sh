#!/bin/bash
# The next session's first call (one nvidia-h200, ~7 min), carry [".device/ext-main",
# ".device/ext-bdyn", ".whl"]:
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r24/next_call1.sh
# ext-main = main's kernels at 980f2fe (rebuild from main if missing); ext-bdyn = 980f2fe +
# bf16_dyn.patch: the BF16 routed-M GEMMs take their tiles in order from the routing's per-call
# counters as the FP8 ones do, through one shared tile ring (pipeline.cuh TileRing,
# mainloop_sm90.cuh take_tile / next_tile / producer_tile) that the FP8 kernel now uses too.
# 1. bitwise (226 outputs) and per phase, S2 + S1, bf16 and fp8_block. Predicted: bf16 S2
#    gate/up 7.0-7.5 -> ~6.6 ms (DRAM 18.1 GB -> ~15), down, dy.Wd^T, dh.Wgu^T -3..-8 %; S1 +-2 %;
#    fp8_block unchanged (the same order through the shared helpers).
# 2. the whole single-GPU suite on ext-bdyn (it changes both kernels' tile loops).
# 3. traffic counters of S2's bf16 forward GEMMs on ext-bdyn.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-main AB_BASE=.device/ext-main AB_DEV=.device/ext-bdyn AB_SHAPES=S2,S1 \
  AB_QUANT="none fp8_block" tools/gpu_round.sh ab,profab,suite; keep ab
OUT=$OUT EXT_DIR=.device/ext-bdyn TRAFFIC_RECIPES=none tools/gpu_round.sh traffic; keep traffic
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt * && find . -maxdepth 1 -type f ! -name summary_all.txt \
  ! -name call.tgz ! -name machine.txt -delete && find . -mindepth 1 -type d -exec rm -rf {} +
