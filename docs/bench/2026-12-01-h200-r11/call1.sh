#!/bin/bash
# Call 1 of next_call.sh (smoke test + suite on the branch) (one nvidia-h200; carry=[".device/ext", ".device/ext-next"]):
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
# A smoke test under a short limit first: the new epilogue synchronizes both consumer
# warpgroups (named barrier 2), and a hang must cost 2 minutes, not the suite's 5.
JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 120 python3 -m pytest -q -x tests/test_cuda_fp8.py \
  -k "saved_equals_recomputed or (matches_fp8_reference and 300)" > "$OUT/fp8_smoke_next.log" 2>&1
rc=$?; echo "fp8 smoke (next) rc=$rc"; tail -15 "$OUT/fp8_smoke_next.log"
[ $rc -eq 0 ] || exit 1
mkdir -p "$OUT/suite"
EXT_DIR=.device/ext-next OUT=$OUT/suite TAIL=2 bash tools/gpu_round.sh suite > "$OUT/suite.log" 2>&1
tail -6 "$OUT/suite.log"
