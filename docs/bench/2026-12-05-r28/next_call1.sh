#!/bin/bash
# The next session's first call (one nvidia-h200, ~8 min): both experiment builds bitwise against
# main's kernels, then per phase on S1 and S2.
#   carry [".device/ext-m28", ".device/ext-pair", ".device/ext-epi", ".whl"] (~45 MiB)
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-05-r28/next_call1.sh
# Build them first on the CPU machine (a fresh checkout has no .device/):
#   PYTHON=<python3.12 with jax 0.11.2, nanobind, nvidia-cutlass> tools/build_ext.sh m28
#   PYTHON=... tools/build_ext.sh pair -DJAX_MOK_FP8_CLUSTER=2 -DJAX_MOK_BF16_CLUSTER=2
#   PYTHON=... tools/build_ext.sh epi -DJAX_MOK_FP8_FUSE_DH=1 -DJAX_MOK_FP8_TMA_STORES=1
# ext-m28 = main's kernels (the default build). ext-pair = 2-CTA clusters in every FP8 GEMM and
# the BF16 routed-M GEMMs, the weight tile B multicast (each CTA of a pair loads one half into
# both). ext-epi = two FP8 epilogue changes: dy·Wd^T quantizes dh along 2F in its epilogue (no
# `quantize dh` pass), and the down / dh·Wgu^T GEMMs store their rows by TMA boxes.
# Predictions: both bitwise equal to ext-m28 (pairs: same tiles, same accumulation order; epi:
# the same bf16 values quantized by the same functions, the same bf16 rows stored by another
# unit). A difference in dx alone under epi: build the two switches apart (dh_q feeds dh·Wgu^T,
# whose rows the TMA stores write). Per phase: pair fp8_block S2 -8..-15 %
# per routed-M GEMM (its plain mainloop is at ~78 % of the FP8 ceiling with the L2 at 94 %), S1
# 0..-5 % (S1's mainloop is not the limit: perf-notes r28); bf16 S2 gate/up -5..-10 %; epi: the
# `quantize dh` row gone (S1 -0.49 ms, S2 -0.36 ms), dy·Wd^T +0.05..+0.15 ms (dh_q written too),
# down and dh·Wgu^T -5..-12 % (S1; their epilogues were 27 % and 15 % of main's time).
# A hang shows as the ab step's timeout (150 s) with no npz: stop there and read the logs.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=".device/ext-pair .device/ext-epi" \
  tools/gpu_round.sh ab; keep ab
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=".device/ext-pair .device/ext-epi" \
  AB_SHAPES=S1,S2 AB_QUANT=fp8_block tools/gpu_round.sh profab; keep profab8
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=.device/ext-pair \
  AB_SHAPES=S1,S2 AB_QUANT=none tools/gpu_round.sh profab; keep profab16
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt --exclude="profab_*.txt" * && \
  find . -maxdepth 1 -type f ! -name summary_all.txt ! -name call.tgz ! -name machine.txt \
  ! -name "profab_*.txt" -delete; find . -mindepth 1 -type d -exec rm -rf {} +
