#!/bin/bash
# Twelfth session, device call 4 (carry .device/ext-new = the final commit's kernels, call 2's
# build): e2e on the Qwen3-30B-A3B-dims model at batch 16 (where the MoE layers dominate the step),
# BF16 against fp8_block, with the step breakdown. e2e.json is rewritten after each variant.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
cp .device/ext-new/_mok_c*.so jax_mok/
XLA_FLAGS=--xla_gpu_enable_command_buffer= PYTHONPATH=$PWD timeout 265 python3 -m benchmarks.e2e.run \
  --layers 4 --batch 16 --batch-policy fixed --variants jax_mok,jax_mok_fp8_block --steps 3 \
  --warmup 1 --max-step-s 30 --breakdown --profile-steps 1 --out $OUT/e2e 2>&1 | tee $OUT/e2e.log | tail -25
echo "e2e rc=${PIPESTATUS[0]}"
