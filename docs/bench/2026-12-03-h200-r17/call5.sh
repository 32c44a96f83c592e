#!/bin/bash
# r17 call 5: the e2e table (issues 21, 22) on the kernels of .device/$EXT: Qwen3-30B-A3B dims,
# 4 layers, every variant at the largest batch the padded einsum runs (shared), jax_mok and
# fp8_block also at their own best batch, step-time breakdown from a profile.
cp .device/${EXT:?}/_mok_c*.so jax_mok/
export PYTHONPATH=$PWD JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-$(git rev-parse --short HEAD)}
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 580 python3 -m benchmarks.e2e.run --layers 4 \
  --batch 32 --batch-policy shared --own-best --own-best-variants jax_mok,jax_mok_fp8_block \
  --breakdown --steps 5 --warmup 2 --max-step-s 30 --out $OUT/e2e > $OUT/e2e.log 2>&1
echo "e2e rc=$?"
tail -30 $OUT/e2e.log | cut -c1-220
