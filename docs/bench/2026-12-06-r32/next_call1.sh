#!/bin/bash
# The next session's first device call (~8 min): the JAX_MOK_SWIGLU_PREFETCH A/B, then main's
# per-phase profile (every recipe) and the quantizer row S4 lacked.
#   carry [".device/ext-main", ".device/ext-sw"]
#   JAX_MOK_GIT_COMMIT=<main's head> OUT=$OUT bash docs/bench/2026-12-06-r32/next_call1.sh
# ext-main = tools/build_ext.sh main (default build), ext-sw = tools/build_ext.sh sw
# -DJAX_MOK_SWIGLU_PREFETCH=1 (README.md here).
# Predictions:
#   - tools/compare_builds.py: ext-sw bitwise equal to ext-main (226 outputs); the BF16 kernel
#     tests (unit) and tests/test_cuda_fp8.py pass on ext-sw.
#   - per phase, "dy Wd^T GEMM + SwiGLU bwd" (BF16) and "fp8 dy Wd^T GEMM + SwiGLU bwd": -5..-15 %
#     on S1 (H100 at eb0b64a: 2.159 / 1.644 ms), -3..-8 % on S2 and S3; every other phase +-2 %.
#     If it is within +-2 % too, the exposed h latency was not what held the epilogue: delete.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
C=${JAX_MOK_GIT_COMMIT:-}
OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C AB_BASE=.device/ext-main \
  AB_DEV=.device/ext-sw AB_SHAPES=S1,S2,S3 PROFILE_TIMEOUT=180 tools/gpu_round.sh ab,profab,unit
keep ab
# ext-sw is still in place (gpu_round's use_ext): its FP8 kernel tests.
(export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_REQUIRE_CUDA=1
 timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_cuda_fp8.py \
   > "$OUT/sw_fp8.log" 2>&1; echo "sw fp8 tests rc=$?"; tail -2 "$OUT/sw_fp8.log")
# ext-main back in place, with the S4 quantizer row (its weights' setup passed 100 s last time).
OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C QUANT_SHAPES=S4 QUANT_TIMEOUT=240 \
  tools/gpu_round.sh quant; keep quant
# main's per-phase profile, every recipe (the per-phase profile at the final commit).
(export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 JAX_MOK_CUDA_PROFILE=1
 for q in none fp8_block mxfp8; do
   timeout 150 python3 tools/kernel_timings.py profile --shapes S1,S2,S3,S6 --quantization $q \
     > "$OUT/profile_$q.log" 2>&1; echo "profile $q rc=$?"
 done
)
OUT=$OUT bash tools/pack_out.sh  # at most 8 files come back: the rest in one archive
