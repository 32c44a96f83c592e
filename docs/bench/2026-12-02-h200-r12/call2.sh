#!/bin/bash
# Twelfth session, device call 2 (carry .device/ext = main's kernels, .device/ext-new = the
# cheap-epilogue build: fp8_block quantization by bracketing products instead of the IEEE
# division, sigmoid with the approximate reciprocal): timings of the new build, the whole
# single-GPU suite on it, the quantizers' GB/s, the S1 fp8_block per-phase profile, then main's
# timings for the same-run A/B (last: cut first if the call runs long).
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
use() { cp "$1"/_mok_c*.so jax_mok/ && echo "extension: $1"; }
timings() {  # timings LABEL LIMIT
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 PYTHONPATH=$PWD timeout $2 python3 tools/kernel_timings.py \
    timings --shapes S1,S2,S3,S6 --quantization none,fp8_block,mxfp8 \
    --fp8-runs fwd,fwdbwd,fwd_prep,fwdbwd_prep > "$OUT/timings_$1.log" 2>&1
  echo "timings $1 rc=$?"
  grep -E "^\| S[0-9] \||ceiling|failed" "$OUT/timings_$1.log" | cut -c1-200
}
use .device/ext-new
timings new 200
EXT_DIR=.device/ext-new OUT=$OUT/r SUITE_TIMEOUT=280 bash tools/gpu_round.sh suite > $OUT/suite.log 2>&1
tail -6 $OUT/suite.log
use .device/ext-new
PYTHONPATH=$PWD timeout 60 python3 tools/kernel_timings.py quantizers --shapes S1,S2 \
  --quantization fp8_block > $OUT/quant_new.log 2>&1; echo "quant rc=$?"; grep "^|" $OUT/quant_new.log
JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 60 \
  python3 tools/kernel_timings.py profile --shapes S1 --quantization fp8_block \
  > "$OUT/profile_new.log" 2>&1; echo "profile rc=$?"
awk '/second call below/{p=1} p' "$OUT/profile_new.log" | grep -E "GEMM|quantize" | head -20
use .device/ext
timings main 120
(cd $OUT && tar czf suite_logs.tgz r && rm -rf r)
