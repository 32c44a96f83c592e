#!/bin/bash
# The protocol table (issues 21, 22) through gpu_round.sh's bench step, balanced routing: jax_mok,
# B2, B3, B6 (Liger at its recorded winners where benchmarks/b6_configs.json has the shape and
# pass; its own search in the first, untimed call elsewhere, after every other row) and the FP8
# group (both recipes from master weights, their `-prep` micro-batch rows, the pre-quantized
# forward, B3-fp8). Half the shapes per call (one call cannot hold all six since the `-prep`
# rows), carry [".device/ext-dev", ".whl"]:
#   SHAPES=S1,S2,S3 OUT=$OUT bash docs/bench/2026-12-03-h200-r19/next_protocol.sh
#   SHAPES=S4,S5,S6 OUT=$OUT bash docs/bench/2026-12-03-h200-r19/next_protocol.sh
# The two results.json go into one table in BENCHMARKS.md (ratios are pair by pair within a
# shape; each run's ceilings are its own).
set -uo pipefail
OUT=$OUT EXT_DIR=.device/ext-dev BENCH_TIMEOUT=575 BENCH_ARGS="--routing balanced \
  --shapes ${SHAPES:?} --impls jax_mok,B2,B3,fp8,B6 --budget-s 540 --item-timeout-s 90" \
  tools/gpu_round.sh bench
(cd $OUT && tar czf bench.tgz bench && rm -rf bench)
