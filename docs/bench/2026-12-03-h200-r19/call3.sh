#!/bin/bash
# r19 call 3, carry [".device/ext-dev", ".device/ext-x1"]: (1) the FP8 rows of the protocol on
# main's kernels (ext-dev = the kernels of 324e109, unchanged since): our BF16, fp8_block from
# master weights, the new fp8_block-prep rows (jax_mok.fp8_weights' layouts made before timing:
# the cost of a micro-batch) and the pre-quantized forward, every shape, balanced; S4 now with
# the CUDA weight quantizer in quantize_params and the harness's 0.9 memory cap. (2) If the call
# has time left: ncu --set full of ext-x1's S1 fp8_block forward GEMMs (x1 = no promotion, the
# BF16 consumer's pipelining: r19 call 1 found it only 3-11 % faster than main, so the FP8
# stage's excess is not the promotion; the counters say whether x1 waits on the feed (full
# barrier, L2) or on the tensor pipe / shared memory). Each step its own OUT subfolder
# (gpu_round.sh tars every *.log in its OUT: a caller's log there is swept away).
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
cp .device/ext-dev/_mok_c*.so jax_mok/
export PYTHONPATH=$PWD JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-$(git rev-parse --short HEAD)}
timeout 290 python3 -m benchmarks.run --routing balanced \
  --impls jax_mok,jax_mok-fp8_block,jax_mok-fp8_block-prep,jax_mok-fp8_block-pq \
  --budget-s 260 --item-timeout-s 70 --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc=$? at ${SECONDS}s"
grep -E "^\[.*(ms|OOM|timeout|error)" $OUT/bench.log | cut -c1-150 | tail -45
if [ $SECONDS -lt 300 ]; then
  mkdir -p $OUT/ncu
  OUT=$OUT/ncu EXT_DIR=.device/ext-x1 NCU_SHAPE=S1 NCU_TIMEOUT=100 tools/gpu_round.sh ncu \
    > $OUT/ncu/round.log 2>&1
  tail -30 $OUT/ncu/round.log
fi
cd $OUT && tar czf bench.tgz bench bench.log && rm -rf bench bench.log
[ -d ncu ] && tar czf ncu.tgz ncu && rm -rf ncu
ls $OUT; echo "done at ${SECONDS}s"
