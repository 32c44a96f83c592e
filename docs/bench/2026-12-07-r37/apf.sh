#!/bin/bash
# r37's kernel experiment on any one GPU (an A/B, both builds in one call):
#   carry [".device/ext-main", ".device/ext-apf4"]
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT [SHAPES=S1,S2,S3] [BODY_S=560] [SKIP_AB=1]
#     [DEVS=".device/ext-apf4 .device/ext-apf8"] bash docs/bench/2026-12-07-r37/apf.sh
# ext-main: the default build (tools/build_ext.sh main); ext-apf4: -DJAX_MOK_A_PREFETCH=4 (the
# gathered-A producers, BF16 and FP8, ask the L2 for each row's K slice four ring stages ahead);
# ext-apf8 (optional, in DEVS): eight stages ahead, the dose-response.
# Why (perf-notes, thirty-seventh session, the ncu of S1's BF16 dy·Wdᵀ): its consumers wait at
# the full barrier 25 % of their samples while DRAM runs at 64 % of peak: the gathered dy rows'
# cp.async latency, with four 48 KB stages in flight, is not covered.
# Predictions:
#   - compare_builds: ext-apf4 bitwise equal to ext-main (the same bytes land in the ring).
#   - dy·Wdᵀ + SwiGLU bwd (A = gathered dy) −5..−15 % on S1 (BF16 and fp8_block), less on S2/S3;
#     gate/up (A = gathered x) −0..−8 %; down, dh·Wguᵀ and the weight gradients unchanged (their
#     A is not gathered through this producer).
set -uo pipefail
# One gpu_round.sh call runs both steps (ab: compare_builds; profab: per-phase profiles of both
# builds, BF16 and fp8_block, and their comparison) under the body's limit.
steps=ab,profab; [ -n "${SKIP_AB:-}" ] && steps=profab
ROUND_TAG=apf OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-} \
  AB_BASE=.device/ext-main AB_DEV="${DEVS:-.device/ext-apf4}" AB_TIMEOUT=120 AB_SHAPES=${SHAPES:-S1,S2,S3} \
  PROFILE_TIMEOUT=75 timeout ${BODY_S:-560} tools/gpu_round.sh $steps
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
