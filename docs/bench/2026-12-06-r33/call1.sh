#!/bin/bash
# r33's first device call (~9 min): two kernel experiments against main, bitwise and per phase.
#   carry [".device/ext-main", ".device/ext-sw", ".device/ext-sk"]
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT bash docs/bench/2026-12-06-r33/call1.sh
# ext-main: tools/build_ext.sh main (default build); ext-sw: -DJAX_MOK_SWIGLU_PREFETCH=1 (r32);
# ext-sk: -DJAX_MOK_WG_SKEW=4 (the routed-M consumer warpgroups start a ring apart).
# Predictions:
#   - compare_builds: ext-sw and ext-sk bitwise equal to ext-main (226 outputs each); the BF16
#     kernel tests and tests/test_cuda_fp8.py pass on both.
#   - ext-sw: "dy Wd^T GEMM + SwiGLU bwd" (BF16, FP8) -5..-15 % on S1, -3..-8 % on S2/S3; the rest
#     +-2 %.
#   - ext-sk: the down GEMMs and dh Wgu^T GEMMs (BF16 and FP8; their epilogues tie the two
#     warpgroups to nothing) -5..-20 % on S1 (short K: the epilogue's share is largest), -2..-8 % on
#     S2/S3; the SwiGLU GEMMs and the weight gradients +-2 % (not skewed).
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
C=${JAX_MOK_GIT_COMMIT:-}
body() {
  OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C AB_BASE=.device/ext-main \
    AB_DEV=".device/ext-sw .device/ext-sk" AB_SHAPES=S1,S2,S3 PROFILE_TIMEOUT=120 \
    tools/gpu_round.sh ab,profab
  keep ab
  for b in sw sk; do
    OUT=$OUT EXT_DIR=.device/ext-$b JAX_MOK_GIT_COMMIT=$C UNIT_TIMEOUT=100 tools/gpu_round.sh unit
    keep unit_$b
    (export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_REQUIRE_CUDA=1
     timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_cuda_fp8.py \
       > "$OUT/fp8_$b.log" 2>&1; echo "$b fp8 tests rc=$?"; tail -2 "$OUT/fp8_$b.log")
  done
}
export -f body keep
OUT=$OUT C=$C timeout 560 bash -c body
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh  # at most 8 files come back: the rest in one archive
