#!/bin/bash
# The next session's first call (written in r21), carry [".device/ext-dev", ".device/ext-wg2",
# ".device/ext-wg3"]:
# ext-dev = main's kernels (bdaf983's SASS), ext-wg2 = wgrad_gather.patch on them: the
# weight-gradient GEMMs gather their token-order operand themselves (x for dWgu; dy for dWd in
# the FP8 backward), coalesced (8 threads per 128-byte line), so the FP8 backward makes no
# expert-order copies of x and dy and the BF16 backward copies dy only. r21's uncoalesced v1 was
# bitwise equal but slowed the dW GEMMs by 29-134 %. Expected bitwise equal (226 outputs).
# Predicted: dW GEMMs within +5 % of the TMA ones; S1 step -0.5 ms (bf16), -1.0 ms (fp8_block).
# ext-wg3 = wgrad_gather_dy.patch on top of ext-wg2: the BF16 backward copies nothing either
# (dy·Wd^T gathers its A, dy, with the routed-M cp.async producer, as the forward gate/up does; dWd
# gathers dy): predicted a further -0.5 ms on S1's bf16 step, dy·Wd^T within +3 %.
# Then the whole single-GPU suite on ext-wg3 (the extension ab/profab leave in place: AB_DEV's
# first; a superset of ext-wg2's code paths, whose FP8 backward it shares). ~470 s.
#   OUT=$OUT bash docs/bench/2026-12-03-h200-r21/next_call1.sh
# If equal and faster: `git apply docs/bench/2026-12-03-h200-r21/wgrad_gather.patch` (and
# wgrad_gather_dy.patch after it if ext-wg3 wins too: the suite ran on it), rebuild
# ext-dev, commit with the numbers; then the protocol (r19 next_protocol.sh, two calls).
OUT=$OUT EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV=".device/ext-wg3 .device/ext-wg2" \
  AB_SHAPES=S1,S2 AB_QUANT="none fp8_block" PROFILE_TIMEOUT=60 SUITE_TIMEOUT=300 \
  tools/gpu_round.sh ab,profab,suite > $OUT/round.txt 2>&1
(cd $OUT && for f in profab_*.txt; do echo "## $f"; cat "$f"; done > profab_all.md 2>/dev/null)
grep -hE "gather|dW|dy Wd|total" $OUT/profab_all.md
tail -8 $OUT/summary.txt
echo "done at ${SECONDS}s"
