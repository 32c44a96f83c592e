#!/bin/bash
# The next session's first call (one nvidia-h200, ~7 min): the pair build bitwise against main's
# kernels, then per phase on S1 and S2 in bf16 and fp8_block.
#   carry [".device/ext-m28", ".device/ext-pair", ".whl"] (~27 MiB)
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-05-r28/next_call1.sh
# Build both first on the CPU machine (a fresh checkout has no .device/):
#   PYTHON=<python3.12 with jax 0.11.2, nanobind, nvidia-cutlass> tools/build_ext.sh m28
#   PYTHON=... tools/build_ext.sh pair -DJAX_MOK_FP8_CLUSTER=2 -DJAX_MOK_BF16_CLUSTER=2
# ext-m28 = main's kernels (the default build: PTX identical to 8a54190's); ext-pair = 2-CTA
# clusters in every FP8 GEMM and the BF16 routed-M GEMMs, the weight tile B multicast (each CTA
# of a pair loads one half into both). Predictions: bitwise equal everywhere (same tiles, same
# accumulation order; only which CTA runs a tile and where B comes from change). Per phase:
# fp8_block S2 -8..-15 % per routed-M GEMM (plain mainloop L2-bound at 94 %; main's at 85 %),
# S1 -3..-8 %; bf16 S2 gate/up -5..-10 % (L2 79 %); weight-gradient (routed-K, expert-K) phases:
# FP8 pairs too (-3..-8 %), BF16 unchanged (not paired). A hang would show as the ab step's
# timeout (150 s) with no npz: then stop and read the logs.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=.device/ext-pair \
  tools/gpu_round.sh ab; keep ab
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=.device/ext-pair \
  AB_SHAPES=S1,S2 AB_QUANT="none fp8_block" tools/gpu_round.sh profab; keep profab
cd $OUT && cat summary_*.txt > summary_all.txt && tar czf call.tgz --exclude=summary_all.txt \
  --exclude=call.tgz --exclude=machine.txt --exclude="profab_*.txt" * && \
  find . -maxdepth 1 -type f ! -name summary_all.txt ! -name call.tgz ! -name machine.txt \
  ! -name "profab_*.txt" -delete; find . -mindepth 1 -type d -exec rm -rf {} +
