#!/bin/bash
# r33's second device call (~9 min): the single-GPU suite on ext-sw (the prefetch build: the
# candidate for the final commit's kernels), then the prefetch A/B repeated twice (call 1's
# profiles: FP8 dy Wd^T -2/-4/-7 % on S1/S2/S3, BF16 -2/+1/+2 %, inside one profile's noise),
# then main's mxfp8 per-phase profile.
#   carry [".device/ext-main", ".device/ext-sw"]
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT bash docs/bench/2026-12-06-r33/call2.sh
# Predictions: suite FP8 files 75 passed 4 skipped, the rest 42 passed (eb0b64a's counts); the
# prefetch's FP8 dy Wd^T phase below main's in both repeats on every shape, BF16 within +-3 %.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
body() {
  OUT=$OUT EXT_DIR=.device/ext-sw JAX_MOK_GIT_COMMIT=$C SUITE_TIMEOUT=330 tools/gpu_round.sh suite
  keep suite
  for r in 1 2; do
    OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C AB_BASE=.device/ext-main \
      AB_DEV=.device/ext-sw AB_SHAPES=S1,S2,S3 PROFILE_TIMEOUT=60 tools/gpu_round.sh profab
    (cd $OUT && for f in profab_*.txt; do mv $f r${r}_$f; done)
    keep profab$r
  done
  cp .device/ext-main/_mok_c*.so jax_mok/  # main's kernels for its profile
  (export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 JAX_MOK_CUDA_PROFILE=1
   timeout 60 python3 tools/kernel_timings.py profile --shapes S1,S2,S3,S6 --quantization mxfp8 \
     > "$OUT/profile_main_mxfp8.log" 2>&1; echo "profile mxfp8 rc=$?")
}
export -f body keep
OUT=$OUT C=${JAX_MOK_GIT_COMMIT:-} timeout 570 bash -c body
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
