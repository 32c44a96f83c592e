#!/bin/bash
# The next session's first call (one nvidia-h200, ~9 min): the three experiment builds against
# main's kernels, bitwise, then per phase on S1 and S2 in fp8_block.
#   carry [".device/ext-m28", ".device/ext-pair", ".device/ext-epi", ".device/ext-ewg"] (~50 MiB;
#   with the ~9 MiB tree the 64 MiB limit leaves no room for .whl, which prebuilt extensions
#   do not need)
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-05-r28/next_call1.sh
# Build them first on the CPU machine (a fresh checkout has no .device/): build_exts.sh here.
# ext-m28 = main's kernels (the default build). ext-pair = 2-CTA clusters in every FP8 GEMM and
# the BF16 routed-M GEMMs, the weight tile B multicast (each CTA of a pair loads one half into
# both). ext-epi = two FP8 epilogue changes: dy·Wd^T quantizes dh along 2F in its epilogue (no
# `quantize dh` pass), and the down / dh·Wgu^T GEMMs store their rows by TMA boxes. ext-ewg =
# ext-epi + dy·Wd^T's SwiGLU backward in a fourth warpgroup fed g in bf16, in the FP8 (fp8_block)
# and the BF16 kernel (whose consumers then issue n128 halves).
# Predictions: pair and epi bitwise equal to ext-m28 (pairs: same tiles, same accumulation order;
# epi: the same bf16 values quantized by the same functions, the same bf16 rows stored by another
# unit); ewg NOT bitwise (g rounded to bf16 before the SwiGLU backward): its outputs downstream
# of dy·Wd^T (dx, d_topk_weights, dW; bf16 and fp8_block) differ by about a bf16 rounding, the
# rest (forward, mxfp8) equal. A difference in dx alone under epi: build its two
# switches apart (dh_q feeds dh·Wgu^T, whose rows the TMA stores write).
# Per phase: pair fp8_block S2 -8..-15 % per routed-M GEMM (its plain mainloop is at ~78 % of the
# FP8 ceiling with the L2 at 94 %), S1 0..-5 % (S1's mainloop is not the limit: perf-notes r28);
# epi: the `quantize dh` row gone (S1 -0.49 ms, S2 -0.36 ms), dy·Wd^T +0.05..+0.15 ms (dh_q
# written too), down and dh·Wgu^T -5..-12 % on S1; ewg: dy·Wd^T S1 1.50 -> 0.8..1.0 ms, S2 2.59
# -> 1.9..2.2 ms against epi's.
# A hang shows as the ab step's timeout (150 s) with no npz: stop there and read the logs.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
DEV=".device/ext-pair .device/ext-epi .device/ext-ewg"
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV="$DEV" tools/gpu_round.sh ab
keep ab
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV="$DEV" AB_SHAPES=S1,S2 \
  AB_QUANT=fp8_block tools/gpu_round.sh profab; keep profab8
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt --exclude="profab_*.txt" * && \
  find . -maxdepth 1 -type f ! -name summary_all.txt ! -name call.tgz ! -name machine.txt \
  ! -name "profab_*.txt" -delete; find . -mindepth 1 -type d -exec rm -rf {} +
