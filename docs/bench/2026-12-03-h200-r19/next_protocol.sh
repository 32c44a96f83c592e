#!/bin/bash
# The protocol table (issues 21, 22) on the kernels of .device/$EXT, balanced routing: jax_mok,
# B2, B3, B6 (Liger at its recorded winners where benchmarks/b6_configs.json has the shape and
# pass; its own search in the first, untimed call elsewhere — RUN_LAST, after every other row)
# and the FP8 group (both recipes from master weights, their `-prep` micro-batch rows, the
# pre-quantized forward, B3-fp8). Half the shapes per call (one call cannot hold all six since
# the `-prep` rows), carry [".device/$EXT", ".whl"]:
#   EXT=ext-dev SHAPES=S1,S2,S3 OUT=$OUT bash docs/bench/2026-12-03-h200-r19/next_protocol.sh
#   EXT=ext-dev SHAPES=S4,S5,S6 OUT=$OUT bash docs/bench/2026-12-03-h200-r19/next_protocol.sh
# Merge the two results.json into one table for BENCHMARKS.md (ratios are pair by pair within a
# shape, so two runs of disjoint shapes are comparable row by row; the ceilings differ slightly).
set -uo pipefail
cp .device/${EXT:?}/_mok_c*.so jax_mok/
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
export JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-$(git rev-parse --short HEAD)}
timeout 575 python3 -m benchmarks.run --routing balanced --shapes ${SHAPES:?} \
  --impls jax_mok,B2,B3,fp8,B6 --budget-s 540 --item-timeout-s 90 --out $OUT/bench \
  > $OUT/bench.log 2>&1
echo "bench rc=$?"
tail -45 $OUT/bench.log | cut -c1-220
cd $OUT && tar czf bench.tgz bench bench.log && rm -rf bench/site
