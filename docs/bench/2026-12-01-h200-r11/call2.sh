#!/bin/bash
# Eleventh session, device call 2 (carry as call1.sh): the same timings on both builds (the A/B:
# .device/ext = main's kernels, .device/ext-next = branch wip/fp8-next), then the branch's
# per-phase profile of S1 and S2 in fp8_block.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
use() { cp "$1"/_mok_c*.so jax_mok/ && echo "extension: $1"; }
timings() {  # timings LABEL
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 PYTHONPATH=$PWD timeout 200 python3 tools/kernel_timings.py \
    timings --shapes S1,S2,S3,S6 --quantization none,fp8_block,mxfp8 \
    --fp8-runs fwd,fwdbwd,fwd_prep,fwdbwd_prep > "$OUT/timings_$1.log" 2>&1
  echo "timings $1 rc=$?"
  grep -E "^\| S[0-9] \||^S[0-9].*kernels|ceiling|failed" "$OUT/timings_$1.log" | cut -c1-240
}
use .device/ext-next
timings next
use .device/ext
timings main
use .device/ext-next
JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 90 \
  python3 tools/kernel_timings.py profile --shapes S1,S2 --quantization fp8_block \
  > "$OUT/profile_next.log" 2>&1; echo "profile rc=$?"
awk '/second call below/{p=1} p' "$OUT/profile_next.log" | grep -E "^---|GEMM|quantize" | head -40
