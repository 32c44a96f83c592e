#!/bin/bash
# The next session's first call (one nvidia-h200, ~8 min), carry [".device/ext-dev",
# ".device/ext-dyn", ".device/ext-m256", ".whl"]:
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r23/next_call1.sh
# 1. traffic (ncu counters: DRAM bytes, L2 read sectors and misses by source unit) of S2's
#    forward GEMMs on main (fp8_block and bf16) and on ext-dyn (fp8_block).
# 2. dyn_schedule.patch (ext-dyn): the FP8 routed-M GEMMs take their tiles in order from a
#    per-call counter in the routing workspace, so that the m-tiles of one expert's n-tile run
#    together and share its weight boxes through L2; m256.patch (ext-m256): 256-row tiles for the
#    down and dh·Wguᵀ GEMMs. Each bitwise against main's kernels (226 outputs), per phase S2 + S1
#    in both recipes; the FP8 GPU tests on each. Predicted (dyn): S2 gate/up 4.7 → ~3.2 ms, down
#    2.4 → ~1.8, dy·Wdᵀ and dh·Wguᵀ −15..−30 %; S1 ±3 %. (m256): S2 down → 1.6–1.9 ms,
#    dh·Wguᵀ → 3.1–3.5 ms.
# At most 8 files come back: everything but the combined summary leaves in call.tgz.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-dev tools/gpu_round.sh traffic; keep traffic_main
OUT=$OUT EXT_DIR=.device/ext-dyn TRAFFIC_RECIPES=fp8_block tools/gpu_round.sh traffic; keep traffic_dyn
OUT=$OUT EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV=".device/ext-dyn .device/ext-m256" \
  AB_SHAPES=S2,S1 AB_QUANT="fp8_block mxfp8" tools/gpu_round.sh ab,profab,fp8; keep ab
OUT=$OUT EXT_DIR=.device/ext-m256 tools/gpu_round.sh fp8only; keep fp8_m256
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt * && find . -maxdepth 1 -type f ! -name summary_all.txt \
  ! -name call.tgz ! -name machine.txt -delete && find . -mindepth 1 -type d -exec rm -rf {} +
