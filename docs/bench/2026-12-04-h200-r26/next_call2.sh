#!/bin/bash
# The next session's second call (one nvidia-h200, ~3 min, right after next_call1.sh on the warm
# machine), carry [".device/ext-bdyn", ".device/ext-v4", ".device/ext-v5", ".whl"]:
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r26/next_call2.sh
# Where the FP8 GEMMs' time goes (main + exp_fp8_bound.patch; timings only, outputs garbage):
#   ext-v4 MOK_EXP_NOEPI            no epilogue (a conditional store of one sum keeps the
#                                   accumulators, and so the wgmmas, alive)
#   ext-v5 MOK_EXP_NOPROMO + NOEPI  a plain FP8 GEMM mainloop: both halves accumulate all K in
#                                   the tensor cores, no promotion, no epilogue
# main - v4 = the unoverlapped epilogue; v4 - v5 = the promotion. (r26's v1, nothing loaded:
# -7 % S1, -10..-14 % S2.) Both keep main's QGMMA count (tools/cubin_sass.py).
set -uo pipefail
OUT=$OUT EXT_DIR=.device/ext-bdyn AB_BASE=.device/ext-bdyn AB_DEV=".device/ext-v4 .device/ext-v5" \
  AB_SHAPES=S1,S2 AB_QUANT=fp8_block tools/gpu_round.sh profab
