#!/bin/bash
# The next session's first call on any one GPU (~260 s): the two kernel changes built at r41 after
# its calls, in the head's default build (ext-main, md5 cbf118d2), against r40's default build
# (ext-base, md5 225fa41d), bitwise and per phase, then the mx GPU tests and S1's timeline on
# the head's build:
#   carry [".device/ext-main", ".device/ext-base", ".whl"]
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT [BODY_S=330] [SHAPES=S1,S6] [QUANT="none fp8_block mxfp8"]
#     bash docs/bench/2026-12-07-r41/ab.sh
# The changes: (1) the mxfp8 rows qdq kernel coalesced (4 lanes a block); (2) the BF16 dy·Wd^T
# epilogue's pass loop rolled (the kernel 5472 -> 2320 SASS instructions; the FP8 dy·Wd^T
# kernels keep theirs, their PTX moved by a hoisted address). Last, S1's BF16 timeline with the
# GPU's clocks sampled beside the synchronized and the back-to-back calls (why back to back
# runs ~0.8 ms a call over the kernels' busy time: the clocks under sustained load?).
# Predictions: compare_builds 226 of 226 outputs bitwise equal (both by construction).
#   (1) mxfp8 (S1, H100): the rows passes ("mx qdq rows" 0.137 / 0.120 ms, "... w_down along H"
#       0.338, "... dh" 0.681, "... w_gate_up along 2F" 0.665) −10..−17 % (from ~2.4 to
#       2.7-2.9 TB/s); the layer −0.15..−0.25 ms.
#   (2) if the unrolled epilogue's code size cost instruction fetch (the hypothesis): BF16 and
#       mxfp8 "dy Wd^T GEMM + SwiGLU bwd" −10..−25 % on S1 (1.84 / 2.13 ms) and S6; if not,
#       within ±3 % (the rolled loop adds 96 moves a pass). fp8_block's within ±2 % either way.
#   Every other phase within ±3 %. Keep each change only where its phase is faster; delete the
#   other (docs/perf-notes.md, forty-first session).
set -uo pipefail
ROUND_TAG=ab OUT=$OUT EXT_DIR=.device/ext-base JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-} \
  AB_BASE=.device/ext-base AB_DEV=.device/ext-main AB_TIMEOUT=110 AB_SHAPES=${SHAPES:-S1,S6} \
  AB_QUANT="${QUANT:-none fp8_block mxfp8}" PROFILE_TIMEOUT=75 \
  TESTS="tests/test_cuda_mx_bf16.py" TESTS_TIMEOUT=120 PROFILE_SHAPES=S1 PROFILE_QUANT=none \
  timeout ${BODY_S:-330} tools/gpu_round.sh ab,profab,tests,timeline
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
