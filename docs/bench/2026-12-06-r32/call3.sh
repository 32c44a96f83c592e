#!/bin/bash
# r32's third device call (~6 min): the default build after both r31 experiments became the only
# path (the flat row quantizer, the token-order scatter into expert order).
#   carry [".device/ext-main"]
#   JAX_MOK_GIT_COMMIT=<main's head> OUT=$OUT bash docs/bench/2026-12-06-r32/call3.sh
# Predictions: the whole single-GPU suite passes (call 1: FP8 75 passed, 4 skipped; rest 42);
# x rows and dh rows >= 80 % of the tool's copy on every shape (call 1 at main: x rows 74-82 %,
# dh rows 84-93 %; call 2's profile of the flat kernel: -11..-18 % time); per-phase profiles as
# call 2's ext-rq / ext-sc columns.
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
C=${JAX_MOK_GIT_COMMIT:-}
OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C tools/gpu_round.sh suite; keep suite
# The extension stays in place (gpu_round's use_ext copied it into jax_mok/).
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_GIT_COMMIT=$C
for s in S1 S2 S3 S4 S5 S6; do  # each shape its own process (a chained run runs out at S4)
  timeout 100 python3 tools/kernel_timings.py quantizers --shapes $s \
    --quantization fp8_block,mxfp8 > "$OUT/quant_$s.log" 2>&1
  echo "quant $s rc=$?"
done
for q in none fp8_block mxfp8; do
  timeout 90 python3 tools/kernel_timings.py profile --shapes S1,S2,S3,S6 --quantization $q \
    > "$OUT/profile_$q.log" 2>&1; echo "profile $q rc=$?"
done
grep -h "HBM copy" "$OUT"/quant_S*.log
grep -h "rows" "$OUT"/quant_S*.log
grep -E "total" "$OUT"/profile_*.log
