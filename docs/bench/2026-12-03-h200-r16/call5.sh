#!/bin/bash
# r16 call 5 (the warm machine after call 4): mxfp8 on S1, S6 with unquantized weight gradients.
# Ran as this command line.
mkdir -p $OUT/d && OUT=$OUT/d EXT_DIR=.device/ext-dev TIMING_SHAPES=S1,S6 TIMING_QUANT=mxfp8 TIMING_FP8_RUNS=fwd,fwdbwd,fwdbwd_prep TIMING_WGRAD=unquantized TIMING_TIMEOUT=100 PROFILE_SHAPES=none bash tools/gpu_round.sh timings > $OUT/d/round.log 2>&1; grep -E "^\| S[0-9]|ceiling" $OUT/d/timings.log | cut -c1-220; tail -2 $OUT/d/summary.txt
