#!/bin/bash
# r42's ab.sh for a short budget: the routing A/B (compare_builds bitwise, per-phase profiles of
# BF16 and fp8_block on S1, S6: ~150 s on an H100, r42) first, then the whole suite on ext-main
# for what is left of BODY_S (stopped by SIGINT at its limit, and then not counted). Same carry
# and builds as r42's ab.sh:
#   carry [".device/ext-main", ".device/ext-base", ".whl"]
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT BODY_S=<s> bash docs/bench/2026-12-07-r43/ab2.sh
# Predictions: r42 ab.sh's.
set -uo pipefail
BODY_S=${BODY_S:-400}
STEPS=ab,profab
[ $(( BODY_S - 200 )) -ge 60 ] && STEPS=ab,profab,suite  # else no time for the suite at all
ROUND_TAG=ab OUT=$OUT EXT_DIR=.device/ext-base JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-} \
  AB_BASE=.device/ext-base AB_DEV=.device/ext-main AB_TIMEOUT=110 AB_SHAPES=S1,S6 \
  AB_QUANT="none fp8_block" PROFILE_TIMEOUT=75 SUITE_TIMEOUT=$(( BODY_S - 200 )) \
  timeout $(( BODY_S - 15 )) tools/gpu_round.sh $STEPS
echo "body rc=$? at ${SECONDS} s"
OUT=$OUT bash tools/pack_out.sh
