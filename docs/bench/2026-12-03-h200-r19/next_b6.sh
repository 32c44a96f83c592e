#!/bin/bash
# B6 (Liger-Kernel) at its own autotune, one shape and pass per call, through gpu_round.sh's bench
# step (which installs the carried wheels): carry [".whl", ".device/ext-dev"].
#   B6_SHAPE=S2 B6_PASS=fwd OUT=$OUT bash docs/bench/2026-12-03-h200-r19/next_b6.sh
# r19: S2's forward search outran a 280-s item limit; here one item gets the whole call (the search
# runs in the first, untimed call; the winners are then timed). The run merges them into
# bench/b6_configs.json in bench.tgz (commit it as benchmarks/b6_configs.json); a call cut short
# leaves bench/results.partial.json for `python -m benchmarks.peers_liger record`.
# Still to record after r19: S2 fwd, S2 fwdbwd, S3-S5 both, S6 fwdbwd.
set -uo pipefail
OUT=$OUT EXT_DIR=.device/ext-dev BENCH_TIMEOUT=570 BENCH_ARGS="--b6-autotune record --impls B6 \
  --routing balanced --shapes ${B6_SHAPE:?} --passes ${B6_PASS:?} --no-ceilings \
  --item-timeout-s 540 --budget-s 550" tools/gpu_round.sh bench
(cd $OUT && tar czf bench.tgz bench && rm -rf bench)
