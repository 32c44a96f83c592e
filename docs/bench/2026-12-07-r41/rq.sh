#!/bin/bash
# The next session's first call on any one GPU: the coalesced mxfp8 rows qdq kernel (ext-main,
# md5 830c5f60, built at r41 after its calls) against the one it replaced (ext-base, md5 225fa41d:
# r40's ext-main), bitwise and per phase, and the mx GPU tests on it:
#   carry [".device/ext-main", ".device/ext-base", ".whl"]
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT [BODY_S=300] [SHAPES=S1,S6] bash docs/bench/2026-12-07-r41/rq.sh
# Predictions: compare_builds 226 of 226 outputs bitwise equal (the same functions on the same 32
# values a block, the amax over a quad); per phase (mxfp8, S1, H100): the rows passes ("mx qdq
# rows" x 0.137 and dy 0.120 ms, "mxfp8 quantize-dequantize w_down along H" 0.338, "... dh"
# 0.681, "... w_gate_up along 2F" 0.665) from ~2.4 TB/s to 2.7-2.9 TB/s (−10..−17 %), the
# layer −0.15..−0.25 ms; every GEMM within ±3 %. Then the suite at the head (call.sh suite).
set -uo pipefail
ROUND_TAG=rq OUT=$OUT EXT_DIR=.device/ext-base JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-} \
  AB_BASE=.device/ext-base AB_DEV=.device/ext-main AB_TIMEOUT=110 AB_SHAPES=${SHAPES:-S1,S6} \
  AB_QUANT=mxfp8 PROFILE_TIMEOUT=75 TESTS="tests/test_cuda_mx_bf16.py" TESTS_TIMEOUT=120 \
  timeout ${BODY_S:-300} tools/gpu_round.sh ab,profab,tests
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
