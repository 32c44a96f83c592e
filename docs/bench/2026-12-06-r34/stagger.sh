#!/bin/bash
# r34's kernel experiment on any one GPU (an A/B: H100 or H200, both builds in one call):
#   carry [".device/ext-main", ".device/ext-st16", ".device/ext-st40"]
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT [SHAPES=S1,S2,S3] [DEVS=".device/ext-st40"] [BODY_S=560] [SKIP_AB=1: no compare_builds] bash docs/bench/2026-12-06-r34/stagger.sh
# ext-main: tools/build_ext.sh main (default build); ext-stN: -DJAX_MOK_SM_STAGGER=N*1024 (odd
# CTAs' consumers start their first routed-M tile N*1024 SM cycles late: ~9 and ~23 us).
# Why: the routed-M GEMMs' tiles are of equal work, so the SMs run in step — every SM's epilogue
# at once (HBM saturated, tensor pipe idle), then every SM's mainloop (HBM idle). dy·Wdᵀ + SwiGLU
# bwd on S1 ran at the sum of its tensor and traffic terms (r33). Offset by about half a tile,
# half the SMs stream epilogue bytes while the other half issue wgmmas.
# Predictions:
#   - compare_builds: ext-st40 bitwise equal to ext-main (226 outputs).
#   - S1: dy·Wdᵀ + SwiGLU bwd −10..−25 % (BF16 and fp8_block; its epilogue moves ~320 KB a tile,
#     its mainloop ~12-17 us a tile), gate/up −3..−10 %, down and dh·Wguᵀ −0..−8 %; S2/S3 smaller
#     (longer K: the epilogue's share is smaller); weight gradients unchanged (not staggered).
#     st16 (~9 us) between main and st40 if the offset holds; no gain at all if the SMs fall back
#     into step after the first tile.
set -uo pipefail
C=${JAX_MOK_GIT_COMMIT:-}
body() {
  if [ -z "$SKIP_AB" ]; then
    OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C AB_BASE=.device/ext-main \
      AB_DEV=".device/ext-st40" AB_TIMEOUT=120 tools/gpu_round.sh ab
    (cd $OUT && mv logs.tgz logs_ab.tgz; mv summary.txt summary_ab.txt)
  fi
  OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C AB_BASE=.device/ext-main \
    AB_DEV="${DEVS:-.device/ext-st40 .device/ext-st16}" AB_SHAPES=${SHAPES:-S1,S2,S3} PROFILE_TIMEOUT=75 \
    tools/gpu_round.sh profab
}
export -f body
OUT=$OUT C=$C SHAPES=${SHAPES:-S1,S2,S3} DEVS=${DEVS:-} SKIP_AB=${SKIP_AB:-} timeout ${BODY_S:-560} bash -c body
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
