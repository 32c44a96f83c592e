#!/bin/bash
# The FP8 rows of the protocol (issue 21) on main's kernels, carry [".device/ext-dev"] (built on
# the CPU machine from main): our BF16, fp8_block from master weights, its `-prep` micro-batch
# rows and the pre-quantized forward, balanced routing. S1 runs on its own after S2-S6 (in one
# run its reference and first compiles ate S1's share of the budget: r19 call 3). ~560 s.
#   OUT=$OUT bash docs/bench/2026-12-03-h200-r20/next_rows.sh
# Returns rows_s2s6.tgz, rows_s1.tgz (results.md with the memory table, results.json, logs).
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
cp .device/ext-dev/_mok_c*.so jax_mok/
export PYTHONPATH=$PWD JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-$(git rev-parse --short HEAD)}
IMPLS=jax_mok,jax_mok-fp8_block,jax_mok-fp8_block-prep,jax_mok-fp8_block-pq
rows() {  # $1 shapes, $2 budget (s), $3 name
  timeout $(( $2 + 40 )) python3 -m benchmarks.run --routing balanced --shapes $1 \
    --impls $IMPLS --budget-s $2 --item-timeout-s 70 --out $OUT/$3 > $OUT/$3.log 2>&1
  echo "rows $1 rc=$? at ${SECONDS}s"
  grep -E "^\[.*(ceilings|ms|OOM|timeout|error)" $OUT/$3.log | cut -c1-150 | tail -36
  (cd $OUT && tar czf $3.tgz $3 $3.log && rm -rf $3 $3.log)
}
rows S2,S3,S4,S5,S6 300 rows_s2s6
rows S1 150 rows_s1
ls $OUT; echo "done at ${SECONDS}s"
