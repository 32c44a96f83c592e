#!/bin/bash
# The next session's first device call (written in r17): .device/ext-dev = main's kernels
# (0a42b8b: one wgmma batch per FP8 promotion group), .device/ext-base = 997eb5a's (GPU-tested),
# .device/ext-off2 = ext-dev + fp8_offset.patch (consumer warpgroup 1 one half behind warpgroup 0
# in every tile; it lost in r17 call 3 when each k32 step still waited for the previous one).
#   1. dev and off2 bitwise against base (compare_builds: 226 outputs);
#   2. S1, S2 fp8_block and S1 mxfp8 per-phase profiles of base, dev, off2 (one process each);
#   3. the whole single-GPU suite on dev.
# Prediction: dev's FP8 GEMM phases -15 to -25 % against base (mainloop 1.23 -> ~0.95 us per
# 128-K stage); off2 a further -5 to -10 % only if the warpgroups' drains coincide.
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85
for v in base dev off2; do
  cp .device/ext-$v/_mok_c*.so jax_mok/
  timeout 120 python3 tools/compare_builds.py run /tmp/ab_$v.npz > $OUT/ab_$v.log 2>&1
  echo "ab_$v rc=$?"
done
for v in dev off2; do
  python3 tools/compare_builds.py compare /tmp/ab_base.npz /tmp/ab_$v.npz > $OUT/abcmp_$v.log 2>&1
  echo "compare base $v rc=$? $(tail -1 $OUT/abcmp_$v.log)"
done
for q in fp8_block mxfp8; do  # mxfp8: S1 only (its groups are single wgmmas; off2 may matter)
  shapes=S1,S2; [ $q = mxfp8 ] && shapes=S1
  for v in base dev off2; do
    cp .device/ext-$v/_mok_c*.so jax_mok/
    JAX_MOK_CUDA_PROFILE=1 timeout 120 python3 tools/kernel_timings.py profile --shapes $shapes \
      --quantization $q --fp8-weight-grads unquantized > $OUT/prof_${v}_$q.log 2>&1
    echo "prof $v $q rc=$?"
  done
  for v in dev off2; do
    python3 tools/kernel_timings.py compare $OUT/prof_base_$q.log $OUT/prof_${v}_$q.log \
      > $OUT/cmp_${v}_$q.txt
    grep -E "fp8 .*GEMM|total" $OUT/cmp_${v}_$q.txt
  done
done
OUT=$OUT/suite EXT_DIR=.device/ext-dev SUITE_TIMEOUT=280 tools/gpu_round.sh suite \
  > $OUT/suite_round.log 2>&1
tail -4 $OUT/suite/summary.txt
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
