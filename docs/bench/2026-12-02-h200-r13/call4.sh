#!/bin/bash
# Thirteenth session, device call 4 (carry .device/ext-s = the final kernels, 0d0b77e): the kernel
# timings of bf16, fp8_block and mxfp8 (S1 S2 S3 S6), the quantizers' GB/s against the HBM copy,
# then e2e at batch 16 (BF16, fp8_block, fp8_block with fp8_weights prepared per step).
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
cp .device/ext-s/_mok_c*.so jax_mok/
export PYTHONPATH=$PWD
XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 220 python3 tools/kernel_timings.py \
  timings --shapes S1,S2,S3,S6 --quantization none,fp8_block,mxfp8 \
  --fp8-runs fwd,fwdbwd,fwd_prep,fwdbwd_prep > "$OUT/timings.log" 2>&1
echo "timings rc=$?"; grep -E "^\| S[0-9] \||ceiling|failed" "$OUT/timings.log" | cut -c1-200
timeout 60 python3 tools/kernel_timings.py quantizers --shapes S1,S2 --quantization fp8_block \
  > $OUT/quant.log 2>&1; echo "quant rc=$?"; grep "^|" $OUT/quant.log
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 200 python3 -m benchmarks.e2e.run --layers 4 \
  --batch 16 --batch-policy fixed --variants jax_mok,jax_mok_fp8_block,jax_mok_fp8_block_prepared \
  --steps 3 --warmup 1 --max-step-s 30 --out $OUT/e2e > $OUT/e2e.log 2>&1
echo "e2e rc=$?"; grep -E "^\| jax" $OUT/e2e.log | head -6
