#!/bin/bash
# The next session's first call (one nvidia-h200, ~7 min), carry [".device/ext-bdyn",
# ".device/ext-sl", ".device/ext-rsh", ".device/ext-v4", ".device/ext-v5", ".whl"] (~61 MiB):
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r26/next_call1.sh
# ext-bdyn = main's kernels. ext-sl = main + scales_early.patch (the FP8 consumers read a group's
# scales before waiting for its wgmmas; same arithmetic, so bitwise equal). Predicted: FP8
# routed-M GEMMs -3..-6 % (a shared-memory load and an FMUL leave the critical path of each
# group: r26's SASS shows the first FMUL after the wait stalled ~2.5 % of all samples).
# ext-rsh = main + rs_a.patch: A from registers (RS wgmma; LDSM of the stage's A once per
# warpgroup, used by both halves), so the tensor cores read only B from shared memory. Its
# layout of A in registers (LDSM_N on 8-bit data) is unproven: the bitwise step decides first.
# Predicted, if the operand reads bind (the n64 quarters, which read A twice as often, lost
# 5-17 %): FP8 routed-M GEMMs -5..-10 %. ptxas: 24-36 bytes of spills outside the mainloop in
# the fp8_block routed-M kernels, more in others (mxfp8, weight gradients): A/B only.
# ext-v4/v5 = main + exp_fp8_bound.patch (timings only, outputs garbage; v1 = no loads ran in
# r26 call 12: -7 % S1, -10..-14 % S2):
#   v4 MOK_EXP_NOEPI    no epilogue (loads and math alone)
#   v5 NOPROMO + NOEPI  a plain FP8 GEMM mainloop: no promotion (both halves accumulate all K in
#                       the tensor cores), no epilogue
# (r26's v2/v3 with NOPROMO measured nothing: ptxas drops wgmmas whose results are unused, so
# those builds ran no math; v5 keeps them: checked with nvdisasm, QGMMA count as main's.)
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-bdyn AB_BASE=.device/ext-bdyn AB_DEV=".device/ext-sl .device/ext-rsh" \
  tools/gpu_round.sh ab; keep ab
OUT=$OUT EXT_DIR=.device/ext-bdyn AB_BASE=.device/ext-bdyn \
  AB_DEV=".device/ext-sl .device/ext-rsh .device/ext-v4 .device/ext-v5" AB_SHAPES=S1,S2 \
  AB_QUANT=fp8_block tools/gpu_round.sh profab; keep profab
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt --exclude="profab_*.txt" * && \
  find . -maxdepth 1 -type f ! -name summary_all.txt ! -name call.tgz ! -name machine.txt \
  ! -name "profab_*.txt" -delete; find . -mindepth 1 -type d -exec rm -rf {} +
