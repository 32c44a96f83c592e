#!/bin/bash
# After call5.sh (written in r17, not yet run): the FP8 variants under gradient accumulation, the
# pattern fp8_weights is for -- 4 micro-batches of 16 sequences per optimizer step, the prepared
# variant quantizing its expert weights once per step for all four (benchmarks/e2e --micro-batches).
cp .device/${EXT:?}/_mok_c*.so jax_mok/
export PYTHONPATH=$PWD JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-$(git rev-parse --short HEAD)}
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 370 python3 -m benchmarks.e2e.run --layers 4 \
  --batch 16 --micro-batches 4 --variants jax_mok,jax_mok_fp8_block,jax_mok_fp8_block_prepared \
  --steps 5 --warmup 2 --max-step-s 30 --out $OUT/e2e_micro > $OUT/e2e_micro.log 2>&1
echo "e2e micro rc=$?"
tail -12 $OUT/e2e_micro.log | cut -c1-220
