#!/bin/bash
# r22 call 2, carry [".device/ext-dev", ".device/ext-base", ".device/src-base.tgz"]:
# ext-dev = d4b369a's kernels (wgrad_gather + wgrad_gather_dy behind KernelTuning.pregather_backward,
# mx_weight_scales, idle_wg); ext-base = 3f7bfee's, run by 3f7bfee's own Python
# (src-base.tgz = git archive 3f7bfee jax_mok tools benchmarks): the new FP8 backward attribute
# pregather_x is unknown to the old build. Bitwise (tools/compare_builds.py, 226 outputs),
# per phase S1, S2 (bf16, fp8_block), then the whole single-GPU suite. ~420 s.
# Predicted: 226 of 226 bitwise equal; S1 step -5 % (bf16 and fp8_block: the gather path),
# S2 within +-3 % (the copy path, as before); suite green.
set -u
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
B=/tmp/base
mkdir -p $B && tar xzf .device/src-base.tgz -C $B && cp .device/ext-base/_mok_c*.so $B/jax_mok/
(cd $B && PYTHONPATH=$B python3 -c "import jax_mok; print('base package:', jax_mok.__file__)")
(cd $B && PYTHONPATH=$B XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 150 \
  python3 tools/compare_builds.py run /tmp/ab_base.npz > $OUT/ab_base.log 2>&1; echo "ab base rc=$?")
for q in none fp8_block; do
  (cd $B && PYTHONPATH=$B JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 60 \
    python3 tools/kernel_timings.py profile --shapes S1,S2 --quantization $q \
    > $OUT/prof_base_$q.log 2>&1; echo "prof base $q rc=$?")
done
cp .device/ext-dev/_mok_c*.so jax_mok/
export PYTHONPATH=$PWD
python3 -c "import jax_mok; print('dev package:', jax_mok.__file__)"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 150 python3 tools/compare_builds.py run \
  /tmp/ab_dev.npz > $OUT/ab_dev.log 2>&1; echo "ab dev rc=$?"
python3 tools/compare_builds.py compare /tmp/ab_base.npz /tmp/ab_dev.npz > $OUT/ab_compare.log 2>&1
echo "ab compare rc=$?"; tail -4 $OUT/ab_compare.log
for q in none fp8_block; do
  JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 60 python3 \
    tools/kernel_timings.py profile --shapes S1,S2 --quantization $q > $OUT/prof_dev_$q.log 2>&1
  echo "prof dev $q rc=$?"
  python3 tools/kernel_timings.py compare $OUT/prof_base_$q.log $OUT/prof_dev_$q.log \
    > $OUT/profab_$q.txt 2>&1
  grep -E "GEMM|gather|quantize|total" $OUT/profab_$q.txt
done
mkdir -p $OUT/suite
OUT=$OUT/suite EXT_DIR=.device/ext-dev tools/gpu_round.sh suite > $OUT/suite_round.txt 2>&1
tail -8 $OUT/suite_round.txt
# at most 8 files come back
(cd $OUT && tar czf all.tgz ./*.log ./*.txt suite && rm -rf ./*.log suite)
ls $OUT; echo "done at ${SECONDS}s"
