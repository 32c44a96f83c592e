#!/bin/bash
# r21 call 4, carry [".device/ext-dev"] (main's kernels): FP8 weight gradients against BF16 ones
# on the gathered producer (MoEConfig.fp8_weight_gradients "fp8" vs the default "unquantized"),
# fp8_block fwd+bwd from master weights and prepared, S1, S3, S6 (S2's K per expert is 256 rows:
# output-bound, skipped), then S1's per-phase profile with FP8 weight gradients. ~300 s.
#   OUT=$OUT bash docs/bench/2026-12-03-h200-r21/call4.sh
cp .device/ext-dev/_mok_c*.so jax_mok/
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1
for g in unquantized fp8; do
  timeout 130 python3 tools/kernel_timings.py timings --shapes S1,S3,S6 --quantization fp8_block \
    --fp8-runs fwdbwd,fwdbwd_prep --fp8-weight-grads $g > $OUT/timings_$g.log 2>&1
  echo "## wgrad $g rc=$?"; grep -vE "^(W|I)[0-9]" $OUT/timings_$g.log | tail -12
done
for g in unquantized fp8; do
  JAX_MOK_CUDA_PROFILE=1 timeout 60 python3 tools/kernel_timings.py profile --shapes S1 \
    --quantization fp8_block --fp8-weight-grads $g > $OUT/prof_$g.log 2>&1
  echo "## profile $g rc=$?"
done
python3 tools/kernel_timings.py compare $OUT/prof_unquantized.log $OUT/prof_fp8.log | tee $OUT/profab.md
echo "done at ${SECONDS}s"
