#!/bin/bash
# r23 call 4 (one nvidia-h200, carry [".device/ext-dev", ".whl"]):
#   OUT=$OUT bash docs/bench/2026-12-04-h200-r23/call4.sh
# 1. S4 forward+backward, BF16 and both FP8 recipes from master weights, through the protocol
#    harness with its fresh-worker retry of out-of-memory items (calls 2-3 ran out of memory
#    on S4's FP8 fwd+bwd beside the shape's other rows; alone it fit at 0.92 of the memory in
#    the tenth session). The -prep rows are left out: master weights (47.4 GiB) + fp8_weights'
#    two layouts (47.3 GiB) + the gradients (47.4 GiB) exceed one H200 by construction.
# 2. ncu of S2's fp8_block forward GEMMs (gate/up, down) in one forward: DRAM bytes
#    read against the FP8 weights' 11.3 GB (is each weight tile read once or twice?) and L2.
set -uo pipefail
OUT=$OUT EXT_DIR=.device/ext-dev BENCH_TIMEOUT=300 BENCH_ARGS="--routing balanced --shapes S4 \
  --passes fwdbwd --impls jax_mok,jax_mok-fp8_block,jax_mok-mxfp8 --budget-s 280 \
  --item-timeout-s 120 --no-ceilings" tools/gpu_round.sh bench
(cd $OUT && tar czf bench.tgz bench && rm -rf bench && mv summary.txt summary_bench.txt \
  && mv logs.tgz logs_bench.tgz)
OUT=$OUT EXT_DIR=.device/ext-dev NCU_KERNEL=fp8_gemm_kernel NCU_SHAPE=S2 NCU_RECIPE=fp8_block \
  NCU_COUNT=2 NCU_TIMEOUT=200 tools/gpu_round.sh ncu
cd $OUT && grep -E "_gemm_kernel|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Hit|L2 Hit|Memory Throughput|dram__bytes" ncu_*_details.log | cut -c1-140 | head -30
# (gpu_round.sh had already put the ncu logs into logs.tgz)
