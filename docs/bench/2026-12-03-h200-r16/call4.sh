#!/bin/bash
# r16 call 4 (the warm machine after call 3): fp8_block with MoEConfig.fp8_weight_gradients="fp8"
# on S3, S6, S1 (fwd+bwd from master weights and with fp8_weights prepared), beside call 3's
# "unquantized" rows, for the default. Ran as this command line.
mkdir -p $OUT/c && OUT=$OUT/c EXT_DIR=.device/ext-dev TIMING_SHAPES=S3,S6,S1 TIMING_QUANT=fp8_block TIMING_FP8_RUNS=fwdbwd,fwdbwd_prep TIMING_WGRAD=fp8 TIMING_TIMEOUT=130 PROFILE_SHAPES=none bash tools/gpu_round.sh timings > $OUT/c/round.log 2>&1; grep -E "^\| S[0-9]|ceiling|^\| shape" $OUT/c/timings.log | cut -c1-220; tail -3 $OUT/c/summary.txt
