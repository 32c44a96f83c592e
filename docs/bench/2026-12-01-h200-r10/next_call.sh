#!/bin/bash
# For the next device session's first call (one nvidia-h200; carry=[".device/ext",
# ".device/ext-quarters"]): .device/ext = main's extension, .device/ext-quarters = main +
# fp8-quarters.patch (branch wip/fp8-quarters), both built on the CPU machine for Python 3.12 /
# jax 0.11.2 (tools: pip wheel with JAX_MOK_CUDA=1, the .so files unzipped). Runs the whole
# single-GPU suite on the branch's build, then the same timings on both builds (the A/B), then
# the branch's per-phase profile.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
use() { cp "$1"/_mok_c*.so jax_mok/ && echo "extension: $1"; }
timings() {  # timings LABEL
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 PYTHONPATH=$PWD timeout 170 python3 tools/kernel_timings.py \
    timings --shapes S1,S2,S3,S6 --quantization none,fp8_block,mxfp8 \
    --fp8-runs fwd,fwdbwd,fwd_prep,fwdbwd_prep > "$OUT/timings_$1.log" 2>&1
  echo "timings $1 rc=$?"
  grep -E "^\| S[0-9] \||^S[0-9].*kernels|ceiling|failed" "$OUT/timings_$1.log" | cut -c1-240
}
use .device/ext-quarters
mkdir -p "$OUT/suite"
EXT_DIR=.device/ext-quarters OUT=$OUT/suite TAIL=2 bash tools/gpu_round.sh suite > "$OUT/suite.log" 2>&1
tail -6 "$OUT/suite.log"
timings quarters
use .device/ext
timings main
use .device/ext-quarters
JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 60 \
  python3 tools/kernel_timings.py profile --shapes S1,S2 --quantization fp8_block \
  > "$OUT/profile_quarters.log" 2>&1; echo "profile rc=$?"
awk '/second call below/{p=1} p' "$OUT/profile_quarters.log" | grep -E "^---|GEMM|quantize" | head -40
