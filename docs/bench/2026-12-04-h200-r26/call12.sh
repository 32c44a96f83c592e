#!/bin/bash
# Call 12 (one nvidia-h200, ~4 min), carry [".device/ext-bdyn", ".device/ext-v1", ".device/ext-v2",
# ".device/ext-v3", ".whl"]:
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r26/call12.sh
# Where the FP8 GEMMs' time goes, by removing parts of their work (outputs are garbage; timings
# only): ext-bdyn = main's kernels; built from main + exp_fp8_bound.patch (FP8 kernel only):
#   ext-v1 (MOK_EXP_NOLOAD)  the producer loads nothing (no cp.async of A and scales, no TMA of B;
#                            the stages' barriers complete at once): the consumers alone
#   ext-v2 (MOK_EXP_NOPROMO) the consumers skip the promotion (wgmma groups and their waits only)
#   ext-v3 (both)            wgmma groups and waits only, nothing loaded
# Reading: v1 ~ main -> the consumers bound it; v1 << main -> data delivery does. v2 gives the
# promotion's share; v3 the rate of the wgmma structure alone (its % of the FP8 ceiling).
set -uo pipefail
OUT=$OUT EXT_DIR=.device/ext-bdyn AB_BASE=.device/ext-bdyn \
  AB_DEV=".device/ext-v1 .device/ext-v2 .device/ext-v3" AB_SHAPES=S1,S2 AB_QUANT=fp8_block \
  tools/gpu_round.sh profab
