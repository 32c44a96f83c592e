#!/bin/bash
# Call 2 of next_call.sh (the A/B timings and the branch's profile) (one nvidia-h200; carry=[".device/ext", ".device/ext-next"]):
#   .device/ext      main's extension (the kernels that ran last)
#   .device/ext-next branch wip/fp8-next (= main + fp8-next.patch): the FP8 consumer in quarters
#                    with the ptxas-clean pipeline, dh quantized along 2F and along tokens and w*a
#                    along tokens in the dy·Wdᵀ epilogue, the conflict-free quantize_segments
# both built on the CPU machine for Python 3.12 / jax 0.11.2 (/work/build312_dir.sh: pip wheel -v
# with JAX_MOK_CUDA=1, the .so files unzipped; tools/check_ptxas.py on its log). Order: the FP8
# tests on the branch first (they decide whether anything else of it counts), then the whole
# suite on it, then the same timings on both builds (the A/B), then the branch's per-phase
# profile of S1 and S2. About 15 minutes of device time.
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
