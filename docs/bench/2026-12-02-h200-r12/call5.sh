#!/bin/bash
# Twelfth session, device call 5 (the warm machine right after call 4; carry .device/ext-new):
# the same e2e at batch 16 for mxfp8 and fp8_block with fp8_weights prepared, BF16 beside.
cp .device/ext-new/_mok_c*.so jax_mok/ && XLA_FLAGS=--xla_gpu_enable_command_buffer= \
  PYTHONUNBUFFERED=1 PYTHONPATH=$PWD timeout 150 python3 -m benchmarks.e2e.run --layers 4 \
  --batch 16 --batch-policy fixed --variants jax_mok,jax_mok_mxfp8,jax_mok_fp8_block_prepared \
  --steps 3 --warmup 1 --max-step-s 30 --out $OUT/e2e 2>&1 | tee $OUT/e2e.log | grep -E "^\| jax|rc="
