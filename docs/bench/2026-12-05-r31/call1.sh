#!/bin/bash
# r31's first device call (~8 min): the single-GPU suite at main's head, then the quantizer table.
#   carry [".device/ext-main"]
#   JAX_MOK_GIT_COMMIT=<main's head> OUT=$OUT bash docs/bench/2026-12-05-r31/call1.sh
# ext-main = the default build of main's head (tools/build_ext.sh main): d02b27c's weight
# quantizer has passed its own bit tests and the fp8_weights tests (r30 call 7), not yet the
# layer's whole FP8 suite. Prediction: every test passes (r30 at d84a9cd: FP8 files 71 passed,
# 4 skipped; the rest 42 passed; this head adds 4 cases to test_quantize_kernel_bits_equal_jax).
# The quantizer table on S1-S3 (dh rows are new: the [T k, 2F] pass the backward runs).
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-} \
  QUANT_SHAPES=S1,S2,S3 QUANT_TIMEOUT=150 tools/gpu_round.sh suite,quant; keep main
