#!/bin/bash
# Thirteenth session, device call 3 (carry .device/ext-q = call 2's quantizers, .device/ext-s =
# ext-q with quantize_segments walking all column tiles of its 128 positions, the next three
# tiles in flight by cp.async): per-phase profiles of both (S1, S2 fp8_block; S1 mxfp8), then
# the whole single-GPU suite on ext-s (the candidate final kernels).
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
use() { cp "$1"/_mok_c*.so jax_mok/ && echo "extension: $1"; }
prof() {  # prof LABEL SHAPES QUANT
  JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 80 \
    python3 tools/kernel_timings.py profile --shapes $2 --quantization $3 > "$OUT/prof_$1.log" 2>&1
  echo "profile $1 rc=$?"
}
use .device/ext-s
prof s_block S1,S2 fp8_block
prof s_mx S1 mxfp8
use .device/ext-q
prof q_block S1,S2 fp8_block
prof q_mx S1 mxfp8
export PYTHONPATH=$PWD
for l in block mx; do
  python3 tools/kernel_timings.py compare $OUT/prof_q_$l.log $OUT/prof_s_$l.log | grep -E "quantize|total"
done
EXT_DIR=.device/ext-s OUT=$OUT/r SUITE_TIMEOUT=300 bash tools/gpu_round.sh suite > $OUT/suite.log 2>&1
tail -6 $OUT/suite.log
cp $OUT/r/summary.txt $OUT/suite_summary.log 2>/dev/null
tail -3 $OUT/r/suite_fp8.log > $OUT/suite_fp8_tail.log 2>/dev/null
tail -3 $OUT/r/suite_rest.log > $OUT/suite_rest_tail.log 2>/dev/null
grep -E "^FAILED|^ERROR" $OUT/r/suite_fp8.log $OUT/r/suite_rest.log | head -20
(cd $OUT && tar czf r.tgz r && rm -rf r && tar czf logs.tgz *.log && rm -f *.log)
