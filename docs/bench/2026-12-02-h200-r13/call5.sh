#!/bin/bash
# Thirteenth session, device call 5 (carry .device/ext-s = main's kernels, .device/ext-stag = the
# same with every odd CTA of the BF16 and FP8 GEMMs starting ~10 us late): does de-phasing the
# SMs' epilogues speed the GEMMs up? Per-phase profiles of S1 in bf16 and fp8_block, both builds,
# fp8_block twice (s, stag, s, stag) so that drift shows.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
use() { cp "$1"/_mok_c*.so jax_mok/ && echo "extension: $1"; }
prof() {  # prof LABEL SHAPES QUANT
  JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 60 \
    python3 tools/kernel_timings.py profile --shapes $2 --quantization $3 > "$OUT/prof_$1.log" 2>&1
  echo "profile $1 rc=$?"
}
use .device/ext-s; prof s_block1 S1 fp8_block; prof s_bf161 S1 none
use .device/ext-stag; prof stag_block1 S1 fp8_block; prof stag_bf161 S1 none
use .device/ext-s; prof s_block2 S1 fp8_block
use .device/ext-stag; prof stag_block2 S1 fp8_block
export PYTHONPATH=$PWD
for c in block1 bf161 block2; do
  python3 tools/kernel_timings.py compare $OUT/prof_s_$c.log $OUT/prof_stag_$c.log | grep -E "GEMM|total"
done
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log)
