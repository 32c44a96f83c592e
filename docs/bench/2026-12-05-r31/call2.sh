#!/bin/bash
# r31's second device call (~9 min): the two experiments of r31 against main, bitwise and timed.
#   carry [".device/ext-main", ".device/ext-rq", ".device/ext-sc"]
#   JAX_MOK_GIT_COMMIT=<main's head> OUT=$OUT bash docs/bench/2026-12-05-r31/call2.sh
# ext-rq = JAX_MOK_ROWQ_FLAT=1 (the flat row quantizer: x rows and the backward's dh);
# ext-sc = JAX_MOK_SCATTER_ROWS=1 (x and dy into expert order by token, F >= 2048).
# Predictions:
#   - tools/compare_builds.py: both builds bitwise equal to ext-main (every output).
#   - ext-rq: test_quantize_kernel_bits_equal_jax passes (8 cases); fp8_block dh rows 63-69 % of
#     the copy -> >= 80 %, mxfp8 69-77 % -> >= 80 % (S1 `quantize dh` 0.54 -> ~0.42 ms on an H100).
#   - ext-sc: the pregather tests pass; S2 "gather x, dy into expert order" 1.26 -> 0.7-0.9 ms
#     (bf16 and fp8_block; reads 0.23 GB instead of up to ~1.9 GB), S1 unchanged (no gather).
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
C=${JAX_MOK_GIT_COMMIT:-}
OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C AB_BASE=.device/ext-main \
  AB_DEV=".device/ext-rq .device/ext-sc" AB_SHAPES=S1,S2 tools/gpu_round.sh ab,profab; keep ab
# ext-rq is in place after ab/profab (AB_DEV's first): its bit tests and its quantizer table.
(export XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_REQUIRE_CUDA=1
 timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_cuda_fp8.py \
   -k quantize_kernel_bits > "$OUT/rq_bits.log" 2>&1; tail -3 "$OUT/rq_bits.log"
 timeout 120 python3 tools/kernel_timings.py quantizers --shapes S1,S3 \
   --quantization fp8_block,mxfp8 > "$OUT/rq_quant.log" 2>&1; tail -12 "$OUT/rq_quant.log")
OUT=$OUT EXT_DIR=.device/ext-sc JAX_MOK_GIT_COMMIT=$C tools/gpu_round.sh unit; keep sc
OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C QUANT_SHAPES=S1,S3 tools/gpu_round.sh quant
keep base
