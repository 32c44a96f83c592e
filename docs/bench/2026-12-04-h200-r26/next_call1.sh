#!/bin/bash
# The next session's first call (one nvidia-h200, ~6 min), carry [".device/ext-bdyn",
# ".device/ext-sl", ".device/ext-rsh", ".device/ext-rsq", ".whl"] (~57 MiB):
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r26/next_call1.sh
# Then, on the warm machine at once, next_call2.sh (the decomposition builds).
# ext-bdyn = main's kernels. Candidates for the FP8 consumers (main + the patch of the same name
# here; FP8 translation units only):
#   ext-sl  scales_early.patch: a group's A/B scales are read (and a·b formed) before the wait for
#           its wgmmas; same arithmetic, so bitwise equal. Predicted -3..-6 % per FP8 GEMM (in
#           main's SASS the first FMUL after each WARPGROUP.DEPBAR stalls on its LDS).
#   ext-rsh rs_a.patch: A from registers (RS wgmma; the stage's A read by LDSM once per
#           warpgroup and used by both halves), so the tensor cores read only B from shared
#           memory. Predicted -5..-10 % if operand reads bind.
#   ext-rsq rs_quarters.patch: the quarter groups that lost in r26 (n64 groups, group n + 1
#           issued before group n is promoted), now with A from registers, so A is not read four
#           times per stage. Predicted: better than main if the quarters lost on A's reads.
# The RS builds' layout of A in registers (LDSM_N on e4m3 data) is unproven: the bitwise step
# decides before any timing counts. ptxas: their mainloops are spill-free (tools/cubin_sass.py
# STL 0 in the fp8_block routed-M kernels); spills elsewhere (prologues, mxfp8, weight gradients).
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-bdyn AB_BASE=.device/ext-bdyn \
  AB_DEV=".device/ext-sl .device/ext-rsh .device/ext-rsq" tools/gpu_round.sh ab; keep ab
OUT=$OUT EXT_DIR=.device/ext-bdyn AB_BASE=.device/ext-bdyn \
  AB_DEV=".device/ext-sl .device/ext-rsh .device/ext-rsq" AB_SHAPES=S1,S2 AB_QUANT=fp8_block \
  tools/gpu_round.sh profab; keep profab
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt --exclude="profab_*.txt" * && \
  find . -maxdepth 1 -type f ! -name summary_all.txt ! -name call.tgz ! -name machine.txt \
  ! -name "profab_*.txt" -delete; find . -mindepth 1 -type d -exec rm -rf {} +
