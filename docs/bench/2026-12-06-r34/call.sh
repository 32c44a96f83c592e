#!/bin/bash
# r34's device calls on an H200 (the issues' machine), at the final commit's kernels:
#   carry [".device/ext-main", ".whl"]   (.whl: liger-kernel 0.8.5 for B6, nvidia-cutlass 4.2.0.0)
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT bash docs/bench/2026-12-06-r34/call.sh PART
# PART:
#   s456   the protocol with peers on S4, S5, S6 (S4's FP8 rows need ~119 GiB: needs_h200), then
#          the per-phase profile of every recipe on S1, S2, S3, S6 (PROFILES: which recipes)
#   s123   the whole single-GPU suite, then the protocol with peers on S1, S2, S3
#   skew   jax_mok alone (BF16) with skewed and balanced routing on S1-S6, for issue 22's
#          "skewed within 1.15x of balanced" (last measured at 2dc886d); ~3 min
#   e2e    the e2e table: 4 layers, the padded einsum's largest batch from 2 down (on an H200 it
#          ran out of memory at 4: a 123 GiB allocation, r22), jax_mok and fp8_block also at their
#          own best batch up to 32 (both ran out of memory at 64 on an H200, r22), step-time
#          breakdown; E2E_TIMEOUT seconds (default 300: the device time left after s456 and s123)
# Each part stays under the device's 600-s limit (the body is cut at 570 s so that pack_out runs).
set -uo pipefail
PART=${1:?usage: call.sh s456|s123|skew|e2e}
C=${JAX_MOK_GIT_COMMIT:?pass JAX_MOK_GIT_COMMIT=<head>}
bench() {
  ROUND_TAG=bench_${1//,/} OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C BENCH_TIMEOUT=$2 \
    BENCH_ARGS="--routing balanced --impls jax_mok,B2,B3,B6,fp8 --shapes $1 \
    --budget-s $(( $2 - 30 )) --item-timeout-s 100" tools/gpu_round.sh bench
}
body() {
  case $PART in
    s456)
      bench S4,S5,S6 330
      for q in ${PROFILES:-none fp8_block mxfp8}; do
        echo "=== profile $q"
        JAX_MOK_CUDA_PROFILE=1 PYTHONPATH=$PWD timeout 70 python3 tools/kernel_timings.py profile \
          --shapes S1,S2,S3,S6 --quantization $q > $OUT/profile_$q.log 2>&1
        echo "profile $q rc=$?"; tail -25 $OUT/profile_$q.log | cut -c1-200
      done ;;
    s123)
      ROUND_TAG=suite OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C SUITE_TIMEOUT=260 \
        tools/gpu_round.sh suite
      bench S1,S2,S3 $(( 560 - SECONDS )) ;;
    skew)
      ROUND_TAG=bench_skew OUT=$OUT EXT_DIR=.device/ext-main JAX_MOK_GIT_COMMIT=$C \
        BENCH_TIMEOUT=240 BENCH_ARGS="--routing skewed,balanced --impls jax_mok --shapes S1,S2,S3,S4,S5,S6 \
        --budget-s 210 --item-timeout-s 60" tools/gpu_round.sh bench ;;
    e2e)
      cp .device/ext-main/_mok_c*.so jax_mok/
      XLA_FLAGS=--xla_gpu_enable_command_buffer= PYTHONPATH=$PWD JAX_MOK_GIT_COMMIT=$C \
        timeout ${E2E_TIMEOUT:-300} python3 -m benchmarks.e2e.run --layers 4 --batch 2 \
        --batch-policy shared --own-best --own-best-variants jax_mok,jax_mok_fp8_block \
        --own-best-cap 32 --breakdown --steps 5 \
        --warmup 2 --max-step-s 30 --out $OUT/e2e > $OUT/e2e.log 2>&1
      echo "e2e rc=$?"; tail -30 $OUT/e2e.log | cut -c1-220 ;;
    *) echo "unknown part $PART"; return 2 ;;
  esac
}
export -f body bench
export OUT C PART
timeout 570 bash -c body
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
