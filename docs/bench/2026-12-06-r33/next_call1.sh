#!/bin/bash
# The next session's first device call on an H200 (~9 min): the single-GPU suite at the final
# commit, then the protocol with peers on S1-S3 (BENCHMARKS.md's command, split by shapes).
#   carry [".device/ext-main", ".whl"]   (.whl: `pip download --no-deps -d .whl liger-kernel`
#   and nvidia-cutlass==4.2.0.0, for B6 and the CuTe headers)
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT bash docs/bench/2026-12-06-r33/next_call1.sh
# The second call: the same with BENCH_SHAPES=S4,S5,S6 and NO_SUITE=1 (S4's FP8 rows need
# ~119 GiB: pass needs_h200). The e2e table (batch 32, own best) is a third call:
# docs/bench/2026-12-03-h200-r17/call5.sh with EXT=ext-main.
# Predictions: suite as on the H100 at this commit (FP8 files 75 passed, 4 skipped; the rest 42
# passed); the FP8 fwd+bwd ratios as the H200 run at eb0b64a within +-0.05 (the prefetch moves
# one backward phase by 1-9 %); B6 at its recorded configs (benchmarks/b6_configs.json).
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
body() {
  if [ -z "${NO_SUITE:-}" ]; then
    OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C SUITE_TIMEOUT=300 \
      tools/gpu_round.sh suite
    keep suite
  fi
  OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 \
    BENCH_TIMEOUT=${BENCH_TIMEOUT:-330} BENCH_ARGS="--routing balanced --impls jax_mok,B2,B3,B6,fp8 \
    --shapes ${BENCH_SHAPES:-S1,S2,S3} --budget-s ${BENCH_BUDGET:-300} --item-timeout-s 90" \
    tools/gpu_round.sh bench
  keep bench
}
export -f body keep
OUT=$OUT C=${JAX_MOK_GIT_COMMIT:-} NO_SUITE=${NO_SUITE:-} BENCH_SHAPES=${BENCH_SHAPES:-} \
  BENCH_TIMEOUT=${BENCH_TIMEOUT:-} BENCH_BUDGET=${BENCH_BUDGET:-} timeout 570 bash -c body
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
