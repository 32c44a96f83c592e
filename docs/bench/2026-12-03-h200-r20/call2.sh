#!/bin/bash
# r20 call 2 (carry [".device/ext-dev"] = b49ba8c's kernels, the new gathered producers):
#   PART=a: the rest of the single-GPU suite (everything GPU-marked but the FP8 files, which
#           passed in call 1) beside ncu's full set of S1's fp8_block forward GEMMs (what binds
#           now that the producers are light), then the protocol's jax_mok rows for S1.
#   PART=b: the protocol's jax_mok rows (our BF16, fp8_block from master weights, -prep, -pq)
#           for S2..S6.
# Each step has its own OUT subfolder; the tarballs come back.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cp .device/ext-dev/_mok_c*.so jax_mok/
export PYTHONPATH=$PWD JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-$(git rev-parse --short HEAD)}
IMPLS=jax_mok,jax_mok-fp8_block,jax_mok-fp8_block-prep,jax_mok-fp8_block-pq
bench() {  # $1 shapes, $2 budget, $3 folder
  timeout $(( $2 + 25 )) python3 -m benchmarks.run --routing balanced --shapes $1 \
    --impls $IMPLS --budget-s $2 --item-timeout-s 70 --out $OUT/$3 > $OUT/$3.log 2>&1
  echo "bench $1 rc=$? at ${SECONDS}s"
  grep -E "^\[.*(ms|OOM|timeout|error)" $OUT/$3.log | cut -c1-150 | tail -40
  (cd $OUT && tar czf $3.tgz $3 $3.log && rm -rf $3 $3.log)
}
if [ "${PART:?}" = a ]; then
  mkdir -p $OUT/ncu
  # ncu's round first: it copies the extension into jax_mok/ at its start, and a copy over a
  # library another process has loaded can crash that process.
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 OUT=$OUT/ncu EXT_DIR=.device/ext-dev NCU_SHAPE=S1 \
    NCU_TIMEOUT=150 tools/gpu_round.sh ncu > $OUT/ncu/round.log 2>&1 &
  n=$!
  sleep 20
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 290 python3 -m pytest -q \
    -m "gpu and not multigpu" tests --ignore=tests/test_cuda_fp8.py \
    --ignore=tests/test_cuda_fp8_weights.py --ignore=tests/test_fp8_weights.py \
    > $OUT/suite_rest.log 2>&1
  echo "suite rest rc=$? at ${SECONDS}s: $(tail -1 $OUT/suite_rest.log)"
  grep -E "^FAILED|^ERROR" $OUT/suite_rest.log | head
  wait $n; tail -8 $OUT/ncu/round.log
  (cd $OUT && tar czf ncu.tgz ncu suite_rest.log && rm -rf ncu suite_rest.log)
  bench S1 170 bench_s1
else
  bench S2,S3,S4,S5,S6 330 bench_s2s6
fi
ls $OUT; echo "done at ${SECONDS}s"
