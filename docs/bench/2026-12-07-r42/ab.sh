#!/bin/bash
# The next session's first call on any one GPU (~550 s): the routing kernels with shared-memory
# counters (built after r42's calls; ext-main, md5 d8e25458, the head's default build) against
# the previous default build (ext-base, md5 5a055398, r41/r42's measured one), bitwise and per
# phase, then the whole single-GPU suite on the head's build:
#   carry [".device/ext-main", ".device/ext-base", ".whl"]
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT [BODY_S=560] [SHAPES=S1,S6] [QUANT="none fp8_block"]
#     bash docs/bench/2026-12-07-r42/ab.sh
# The change (ffi/cuda/device/route.cuh): each count/place warp keeps its running counts in
# shared memory instead of global memory and loads its 32 rounds of ids before the first, the
# skipped-assignment pass folded into place, the memset gone (count writes every cell). The
# other 84 kernels' PTX is ext-base's (tools/ptx_compare.py).
# Predictions: compare_builds 226 of 226 outputs bitwise equal (the same ranks by construction);
#   "routing" S1 0.103 / 0.088 ms -> 0.03-0.05, S6 0.070 / 0.060 -> 0.015-0.03 (H100); every
#   other phase within +-3 %; the suite 127 passed, 4 skipped.
# With a short budget (BODY_S below ~500 s) the suite gets what the A/B leaves (~150 s on an
# H100), stopped by SIGINT at its limit and then not counted; under 60 s it is left out.
set -uo pipefail
BODY_S=${BODY_S:-560}
SUITE_S=$(( BODY_S - 200 < 300 ? BODY_S - 200 : 300 ))
STEPS=ab,profab
[ $SUITE_S -ge 60 ] && STEPS=ab,profab,suite
ROUND_TAG=ab OUT=$OUT EXT_DIR=.device/ext-base JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-} \
  AB_BASE=.device/ext-base AB_DEV=.device/ext-main AB_TIMEOUT=110 AB_SHAPES=${SHAPES:-S1,S6} \
  AB_QUANT="${QUANT:-none fp8_block}" PROFILE_TIMEOUT=75 SUITE_TIMEOUT=$SUITE_S \
  timeout $BODY_S tools/gpu_round.sh $STEPS
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
