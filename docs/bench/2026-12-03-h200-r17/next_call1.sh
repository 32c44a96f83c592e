#!/bin/bash
# The next session's first device call (written in r17), carry [".device/ext-base",
# ".device/ext-dev", ".device/ext-off2"]: .device/ext-dev = main's kernels (0a42b8b: one wgmma
# batch per FP8 promotion group), .device/ext-base = 997eb5a's (GPU-tested), .device/ext-off2 =
# ext-dev + fp8_offset.patch (consumer warpgroup 1 one half behind warpgroup 0 in every tile; it
# lost in r17 call 3 when each k32 step still waited for the previous one). Through
# tools/gpu_round.sh: dev and off2 bitwise against base (compare_builds), and S1, S2 per-phase
# profiles of all three, fp8_block and mxfp8 (the layer's default weight-gradient mode).
# Prediction: dev's fp8_block GEMM phases -15 to -25 % against base (mainloop 1.23 -> ~0.95 us
# per 128-K stage), mxfp8 unchanged; off2 a further -5 to -10 % only if the warpgroups' drains
# coincide. The suite runs in next_call2.sh.
OUT=$OUT EXT_DIR=.device/ext-dev AB_DEV=".device/ext-dev .device/ext-off2" AB_SHAPES=S1,S2 \
  AB_QUANT="fp8_block mxfp8" PROFILE_TIMEOUT=90 tools/gpu_round.sh ab,profab > $OUT/round.log 2>&1
grep -hE "fp8 .*GEMM|total" $OUT/profab_*.txt
tail -14 $OUT/summary.txt
