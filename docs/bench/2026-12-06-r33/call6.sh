#!/bin/bash
# r33's sixth device call (~3 min): the independent-tiles experiment (JAX_MOK_FP8_IND_TILES=1:
# fp8_block down and dh Wgu^T GEMMs with each consumer warpgroup on its own 128 x 128 tile and
# ring, fp8_gemm_ind.cuh) against main, bitwise and per phase, then its FP8 kernel tests.
#   carry [".device/ext-main", ".device/ext-ind"]
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT bash docs/bench/2026-12-06-r33/call6.sh
# Predictions: 226 of 226 outputs bitwise equal; tests/test_cuda_fp8.py passes; "fp8 down GEMM x
# weight" S1 1.09 -> 0.80-0.95 ms, "fp8 dh Wgu^T GEMM" S1 1.70 -> 1.45-1.60 ms; S3 -3..-10 %;
# S2 +-5 % (L2-bound: 1.33x the A bytes). Short limits: a hang costs at most a minute a step.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
body() {
  OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C AB_BASE=.device/ext-main \
    AB_DEV=.device/ext-ind AB_SHAPES=S1,S2,S3 AB_QUANT=fp8_block AB_TIMEOUT=60 PROFILE_TIMEOUT=45 \
    tools/gpu_round.sh ab,profab
  keep ab
  (export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_REQUIRE_CUDA=1
   timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_cuda_fp8.py \
     > "$OUT/fp8_ind.log" 2>&1; echo "ind fp8 tests rc=$?"; tail -2 "$OUT/fp8_ind.log")
}
export -f body keep
OUT=$OUT C=${JAX_MOK_GIT_COMMIT:-} timeout 300 bash -c body
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
