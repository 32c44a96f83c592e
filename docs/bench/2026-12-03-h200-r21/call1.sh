#!/bin/bash
# r21 call 1, carry [".device/ext-dev", ".device/ext-quant"]: ext-dev = main's kernels
# (bdaf983 = 91c93ac's SASS), ext-quant = r20's quantizers.patch on them. One gpu_round.sh run:
# ab (bitwise, 226 outputs expected equal), profab S1,S2 fp8_block (ext-dev vs ext-quant; predicted
# weight quantizer -5..-15 %, quantize dh -5..-10 %), the quantizers' GB/s and the whole
# single-GPU suite, both on ext-quant (the extension ab/profab leave in place). ~450 s.
#   OUT=$OUT bash docs/bench/2026-12-03-h200-r21/call1.sh
OUT=$OUT EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV=.device/ext-quant \
  AB_SHAPES=S1,S2 AB_QUANT=fp8_block PROFILE_TIMEOUT=90 QUANT_SHAPES=S1,S2,S4 \
  QUANT_RECIPES=fp8_block,mxfp8 SUITE_TIMEOUT=300 \
  tools/gpu_round.sh ab,profab,quant,suite > $OUT/round.txt 2>&1
(cd $OUT && for f in profab_*.txt; do echo "## $f"; cat "$f"; done > profab_all.md 2>/dev/null)
grep -hE "quantize|total" $OUT/profab_all.md
tail -12 $OUT/round.txt
ls $OUT; echo "done at ${SECONDS}s"
