#!/bin/bash
# Call 3 (not run this session: no machine was lent after call 2): the whole single-GPU suite
# with the quarter-pipelined FP8 consumer (main + fp8-quarters.patch, built on the CPU machine and
# carried in .device/ext), then timings of both recipes and the S1/S2 per-phase profile.
set -uo pipefail
OUT=$OUT TIMING_SHAPES=S1,S2,S3,S6 TIMING_QUANT=fp8_block,mxfp8 \
  TIMING_FP8_RUNS=fwd,fwdbwd,fwd_prep,fwdbwd_prep TIMING_TIMEOUT=150 \
  PROFILE_SHAPES=S1,S2 PROFILE_QUANT=fp8_block PROFILE_TIMEOUT=60 TAIL=20 \
  bash tools/gpu_round.sh suite,timings
