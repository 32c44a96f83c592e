#!/bin/bash
# r17 call 3: the FP8 consumer mainloop. ext-dev = main (997eb5a's kernels); ext-v13 = each
# stage's full-barrier wait and proxy fence moved under the previous stage's last wgmmas, and
# fp8_block's promotion factors read before the wgmmas (stage released at its last drain);
# ext-off = ext-v13 + consumer warpgroup 1 starting each tile one half (4 k32 steps) after
# warpgroup 0 (named barrier 5), so the two warpgroups' promotion drains stop coinciding.
# Prediction (call 2's sweep: the FP8 mainloop costs 1.23-1.30 us per 128-K stage against
# 0.79 us at the FP8 ceiling): v13 -3 to -8 % on the FP8 GEMMs; off -15 to -25 % if the two
# warpgroups drain in phase, ~0 otherwise. Both must be bitwise equal to ext-dev.
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85
for v in dev v13 off; do
  cp .device/ext-$v/_mok_c*.so jax_mok/
  timeout 120 python3 tools/compare_builds.py run /tmp/ab_$v.npz > $OUT/ab_$v.log 2>&1
  echo "ab_$v rc=$?"
done
for v in v13 off; do
  python3 tools/compare_builds.py compare /tmp/ab_dev.npz /tmp/ab_$v.npz > $OUT/abcmp_$v.log 2>&1
  echo "compare dev $v rc=$? $(tail -1 $OUT/abcmp_$v.log)"
done
for q in fp8_block mxfp8; do
  shapes=S1,S2; [ $q = mxfp8 ] && shapes=S1
  for v in dev v13 off; do
    cp .device/ext-$v/_mok_c*.so jax_mok/
    JAX_MOK_CUDA_PROFILE=1 timeout 120 python3 tools/kernel_timings.py profile --shapes $shapes \
      --quantization $q --fp8-weight-grads unquantized > $OUT/prof_${v}_$q.log 2>&1
    echo "prof $v $q rc=$?"
  done
  for v in v13 off; do
    python3 tools/kernel_timings.py compare $OUT/prof_dev_$q.log $OUT/prof_${v}_$q.log \
      > $OUT/cmp_${v}_$q.txt
    grep -E "fp8 .*GEMM|total" $OUT/cmp_${v}_$q.txt
  done
done
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
