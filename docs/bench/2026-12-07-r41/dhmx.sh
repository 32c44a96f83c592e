#!/bin/bash
# r41 call 3 on any one GPU: mxfp8's dh made by dy·Wd^T's epilogue (kSwiGLUBwdMx) against the
# qdq pass it replaces, and the timeline's host side:
#   carry [".device/ext-main", ".device/ext-dhmx", ".whl"]
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT [BODY_S=560] [SHAPES=S1,S6,S3] [TL_SHAPES=S1,S6] [TL_QUANT="none mxfp8"]
#   [STEPS=ab,profab,tests,timeline] bash docs/bench/2026-12-07-r41/dhmx.sh
# ext-main: main's default build (md5 225fa41d); ext-dhmx: the head's (tools/build_ext.sh dhmx),
# whose other 87 kernels' PTX is main's (tools/ptx_compare.py).
# Predictions:
#   - compare_builds: 226 of 226 outputs bitwise equal (the epilogue quantizes dh's stored bf16
#     values with the qdq kernel's functions, amax over a quad instead of one thread).
#   - mxfp8 per phase (S1): "mxfp8 quantize-dequantize dh" (0.69-0.74 ms) gone; dy·Wd^T + SwiGLU
#     bwd +0.15..0.35 ms (its epilogue, exposed, gains a read-back, the qdq math and a second
#     copy-out of dh); the layer -0.35..-0.55 ms. (The FP8 path's E4M3 dh in this epilogue lost,
#     r29-r30: +1.2..1.8 ms; that epilogue also wrote scales and ran 128-column blocks.)
#   - the mx GPU tests pass; the timeline's host lines name what fills the ~0.8 ms between calls.
set -uo pipefail
ROUND_TAG=dhmx OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:-} \
  AB_BASE=.device/ext-main AB_DEV=.device/ext-dhmx AB_TIMEOUT=110 AB_SHAPES=${SHAPES:-S1,S6,S3} \
  AB_QUANT=mxfp8 PROFILE_TIMEOUT=75 TESTS="tests/test_cuda_mx_bf16.py tests/test_cuda_fp8.py -k mx" \
  TESTS_TIMEOUT=150 PROFILE_SHAPES=${TL_SHAPES:-S1,S6} PROFILE_QUANT="${TL_QUANT:-none mxfp8}" \
  timeout ${BODY_S:-560} tools/gpu_round.sh ${STEPS:-ab,profab,tests,timeline}
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
