#!/bin/bash
# The FP8 rows of the protocol (issue 21) on main's kernels, carry [".device/ext-dev"] (built on
# the CPU machine from main): our BF16, fp8_block from master weights, its `-prep` micro-batch
# rows and the pre-quantized forward, balanced routing, through gpu_round.sh's bench step. S1
# runs on its own after S2-S6 (in one run its reference and first compiles ate S1's share of the
# budget: r19 call 3). ~560 s.
#   OUT=$OUT bash docs/bench/2026-12-03-h200-r20/next_rows.sh
# Returns rows_s2s6.tgz, rows_s1.tgz (each: bench/ with results.md, the memory table,
# results.json and logs; the step summary).
set -uo pipefail
IMPLS=jax_mok,jax_mok-fp8_block,jax_mok-fp8_block-prep,jax_mok-fp8_block-pq
rows() {  # $1 shapes, $2 budget (s), $3 name
  mkdir -p $OUT/$3
  OUT=$OUT/$3 EXT_DIR=.device/ext-dev BENCH_TIMEOUT=$(( $2 + 40 )) BENCH_ARGS="--routing \
    balanced --shapes $1 --impls $IMPLS --budget-s $2 --item-timeout-s 70" \
    tools/gpu_round.sh bench > $OUT/$3.txt 2>&1
  grep -E "^\[.*(ceilings|ms|OOM|timeout|error)|^bench:" $OUT/$3.txt | cut -c1-150 | tail -36
  (cd $OUT && tar czf $3.tgz $3 $3.txt && rm -rf $3 $3.txt)
}
rows S2,S3,S4,S5,S6 300 rows_s2s6
rows S1 150 rows_s1
ls $OUT; echo "done at ${SECONDS}s"
