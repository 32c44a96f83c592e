#!/bin/bash
# The next session's first call (written in r21), carry [".device/ext-dev", ".device/ext-wg2",
# ".device/ext-wg3", ".device/ext-ws", ".device/ext-mx"]; ext-dev = main's kernels (bdaf983's
# SASS). Four candidates on it, each expected bitwise equal (226 outputs of
# tools/compare_builds.py):
# - ext-wg2 = wgrad_gather.patch: the weight-gradient GEMMs gather their token-order operand
#   themselves (x for dWgu; dy for dWd in the FP8 backward), coalesced (8 threads per 128-byte
#   line), so the FP8 backward makes no expert-order copies of x and dy and the BF16 backward
#   copies dy only. r21's uncoalesced v1 was bitwise equal but slowed the dW GEMMs by 29-134 %.
#   Predicted: dW GEMMs within +5 %; S1 step -0.5 ms (bf16), -1.0 ms (fp8_block).
# - ext-wg3 = wgrad_gather_dy.patch on top of ext-wg2: the BF16 backward copies nothing either
#   (dy·Wd^T gathers dy with the routed-M cp.async producer, as the forward gate/up gathers x).
#   Predicted: a further -0.5 ms on S1's bf16 step, dy·Wd^T within +3 %.
# - ext-ws = wgrad_store.patch: the weight-gradient tiles send their output from the ring stage
#   they read last, four TMA boxes without waits, the stage handed back a k-block into the next
#   tile. Predicted: S2 dWgu 9.2 -> ~6 ms, dWd 4.6 -> ~3.5 (if the epilogue's stores are what
#   serialize; docs/perf-notes.md twenty-first session); S1 dW -0 to -10 %.
# - ext-mx = mx_weight_scales.patch + idle_wg.patch (independent code, separate phases): the
#   mxfp8 weight quantizer stores a row's 4 along-A scale bytes as one word (they were 1-byte
#   stores, a third of the tile's store transactions) — predicted mxfp8 weights 56-65 % ->
#   >= 75 % of the copy rate; and a routed-M FP8 consumer warpgroup with no row in the tile
#   issues no wgmma and no promotion — predicted S5 (4 positions per expert) pre-quantized and
#   prepared forwards -30 to -50 % in mxfp8 (promotion-bound), -10 to -30 % in fp8_block; other
#   shapes unchanged.
# ab + profab (S1, S2; bf16 and fp8_block), then the quantizers' GB/s and S5's FP8 forwards on
# ext-dev and ext-mx (quantizer calls now timed back to back), ~400 s:
#   OUT=$OUT bash docs/bench/2026-12-03-h200-r21/next_call1.sh
# Then: apply the winners to main (wgrad_gather_dy.patch needs wgrad_gather.patch first; both
# apply on top of wgrad_store.patch), rebuild ext-dev, and run ab (against the old ext-dev) and
# the whole single-GPU suite on the combination in the next call (gpu_round.sh ab,suite).
OUT=$OUT EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev \
  AB_DEV=".device/ext-wg3 .device/ext-wg2 .device/ext-ws .device/ext-mx" \
  AB_SHAPES=S1,S2 AB_QUANT="none fp8_block" PROFILE_TIMEOUT=60 \
  tools/gpu_round.sh ab,profab > $OUT/round.txt 2>&1
(cd $OUT && for f in profab_*.txt; do echo "## $f"; cat "$f"; done > profab_all.md 2>/dev/null)
grep -hE "^## |gather|dW|dy Wd|total" $OUT/profab_all.md
tail -14 $OUT/summary.txt
for b in dev mx; do
  cp .device/ext-$b/_mok_c*.so jax_mok/
  PYTHONPATH=$PWD JAX_MOK_REQUIRE_CUDA=1 timeout 90 python3 tools/kernel_timings.py quantizers \
    --shapes S1,S2 --quantization mxfp8,fp8_block > $OUT/quant_$b.log 2>&1
  echo "## quantizers ext-$b rc=$?"; grep -E "^\| S|copy" $OUT/quant_$b.log
  PYTHONPATH=$PWD JAX_MOK_REQUIRE_CUDA=1 timeout 90 python3 tools/kernel_timings.py timings \
    --shapes S5 --quantization fp8_block,mxfp8 --fp8-runs pq,fwd_prep > $OUT/quant_s5_$b.log 2>&1
  echo "## S5 FP8 forwards ext-$b rc=$?"; grep -E "^\| S5" $OUT/quant_s5_$b.log
done
# at most 8 files come back: the per-build tables and quantizer logs as one archive
(cd $OUT && tar czf rest.tgz profab_ext-*.txt quant_*.log && rm -f profab_ext-*.txt quant_*.log)
ls $OUT; echo "done at ${SECONDS}s"
