#!/bin/bash
# The next session's first call on any one GPU (~220 s): the kernel change built at r41 after
# its calls, in the head's default build (ext-main, md5 5a055398), against r40's default build
# (ext-base, md5 225fa41d), bitwise and per phase, then the mx GPU tests and S1's timeline on
# the head's build:
#   carry [".device/ext-main", ".device/ext-base", ".whl"]
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT [BODY_S=330] [SHAPES=S1,S6] [QUANT="mxfp8 none"]
#     bash docs/bench/2026-12-07-r41/ab.sh
# The change: the mxfp8 rows qdq kernel coalesced (4 lanes a block; the other 86 kernels' PTX
# is ext-base's). Last, S1's BF16 timeline with the GPU's clocks sampled beside the synchronized
# and the back-to-back calls (why back to back runs ~0.8 ms a call over the kernels' busy time:
# the clocks under sustained load?). BF16's profile is the control (it runs no changed kernel).
# Predictions: compare_builds 226 of 226 outputs bitwise equal (by construction); mxfp8 (S1,
#   H100): the rows passes ("mx qdq rows" 0.137 / 0.120 ms, "... w_down along H" 0.338, "... dh"
#   0.681, "... w_gate_up along 2F" 0.665) −10..−17 % (from ~2.4 to 2.7-2.9 TB/s), the layer
#   −0.15..−0.25 ms; every other phase (and BF16, fp8_block: they do not run this kernel) within
#   ±3 %. Kept only if those passes are faster (docs/perf-notes.md, forty-first session).
set -uo pipefail
ROUND_TAG=ab OUT=$OUT EXT_DIR=.device/ext-base JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-} \
  AB_BASE=.device/ext-base AB_DEV=.device/ext-main AB_TIMEOUT=110 AB_SHAPES=${SHAPES:-S1,S6} \
  AB_QUANT="${QUANT:-mxfp8 none}" PROFILE_TIMEOUT=75 \
  TESTS="tests/test_cuda_mx_bf16.py" TESTS_TIMEOUT=120 PROFILE_SHAPES=S1 PROFILE_QUANT=none \
  timeout ${BODY_S:-330} tools/gpu_round.sh ab,profab,tests,timeline
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
