#!/bin/bash
# r17 call 4: the protocol table (issues 21, 22) on the kernels of .device/$EXT (the build of the
# commit this call's record names), balanced routing, jax_mok + B2 + B3 + B6 (Liger at its
# recorded winners where benchmarks/b6_configs.json has the shape, its own search in the first
# untimed call elsewhere) + the FP8 rows; the liger-kernel wheel carried in .whl/.
cp .device/${EXT:?}/_mok_c*.so jax_mok/
export PYTHONPATH=$PWD JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-$(git rev-parse --short HEAD)}
timeout 575 python3 -m benchmarks.run --routing balanced --impls jax_mok,B2,B3,fp8 \
  --budget-s 520 --item-timeout-s 90 --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc=$?"
tail -45 $OUT/bench.log | cut -c1-220
cd $OUT && tar czf bench.tgz bench bench.log && rm -rf bench/site
