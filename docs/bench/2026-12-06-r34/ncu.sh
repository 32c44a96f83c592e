#!/bin/bash
# r34's fallback call when no H200 comes (any one GPU): ncu's full set, with per-SASS stall
# samples, of one launch each of the dy·Wdᵀ + SwiGLU-backward GEMM on S1 — fp8_block's
# (fp8_gemm_kernel<..., Epi8::kSwiGLUBwd, bf16>) and BF16's (wgmma_gemm_kernel<kRoutedBK,
# kSwiGLUBwd>) — to see whether its epilogue waits on the stores (dh, w·a), on h's loads or on the
# SwiGLU-backward arithmetic (docs/perf-notes.md, thirty-third session).
#   carry [".device/ext-main", ".whl"]; JAX_MOK_GIT_COMMIT=<head> OUT=$OUT bash docs/bench/2026-12-06-r34/ncu.sh
set -uo pipefail
for q in fp8_block none; do
  if [ $q = none ]; then k='wgmma_gemm_kernelILNS0_4ModeE1ELNS0_3EpiE4E'
  else k='fp8_gemm_kernelILNS1_6RecipeE2E.*Epi8E2E13__nv_bfloat16'; fi  # Recipe::kBlock = 2
  ROUND_TAG=$q OUT=$OUT EXT_DIR=.device/ext-main NCU_WHAT=profile NCU_SHAPE=S1 NCU_RECIPE=$q \
    NCU_NAME_BASE=mangled NCU_KERNEL="$k" NCU_COUNT=1 NCU_TIMEOUT=200 tools/gpu_round.sh ncu
done
OUT=$OUT bash tools/pack_out.sh
