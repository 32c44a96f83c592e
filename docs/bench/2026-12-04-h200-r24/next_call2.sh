#!/bin/bash
# The next session's second call (one nvidia-h200, ~7 min), carry [".device/ext-main", ".whl"]
# (or the merged winner's build in ext-main): where the FP8 routed-M GEMMs' time goes now that
# they read their weights about once (dyn order).
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r24/next_call2.sh
# 1. ncu's full set of S2's fp8_block forward GEMMs (gate/up, down): before the dyn order the
#    gate/up showed L2 throughput 93 %, tensor pipe 58 %, DRAM 77 % (r23 call 4); is L2 (the
#    L2 -> SM bytes: ~26 GB per gate/up) the bound now?
# 2. the same for S1's fp8_block gate/up (epilogue-bound: tensor pipe idle ~29 % of the
#    consumers' time, earlier).
# 3. the BF16 weight gradients (routed-K, mangled names contain ModeE2E) on S2: is their ~6.2 TB/s
#    of L2 -> SM loads (perf-notes r24) the same bound?
# 4. the quantizer timings alone (kernel_timings.py quantizers: it ran out of memory after S2
#    when run after other steps in one process chain).
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-main NCU_SHAPE=S2 NCU_RECIPE=fp8_block tools/gpu_round.sh ncu; keep ncu_s2
OUT=$OUT EXT_DIR=.device/ext-main NCU_SHAPE=S1 NCU_RECIPE=fp8_block NCU_COUNT=1 tools/gpu_round.sh ncu; keep ncu_s1
OUT=$OUT EXT_DIR=.device/ext-main NCU_SHAPE=S2 NCU_RECIPE=none NCU_WHAT=profile \
  NCU_NAME_BASE=mangled NCU_KERNEL=ModeE2E NCU_COUNT=2 tools/gpu_round.sh ncu; keep ncu_dw
OUT=$OUT EXT_DIR=.device/ext-main tools/gpu_round.sh quant; keep quant
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt * && find . -maxdepth 1 -type f ! -name summary_all.txt \
  ! -name call.tgz ! -name machine.txt -delete && find . -mindepth 1 -type d -exec rm -rf {} +
