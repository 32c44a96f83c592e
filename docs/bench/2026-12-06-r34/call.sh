#!/bin/bash
# The final-commit device calls of issues 21 and 22 on an H200, at the carried kernels:
#   carry [".device/ext-main", ".whl"]   (.whl: liger-kernel 0.8.5 for B6, nvidia-cutlass 4.2.0.0)
#   JAX_MOK_GIT_COMMIT=<head> OUT=$OUT bash docs/bench/2026-12-06-r34/call.sh PIECE [PIECE...]
# The pieces run in the order given, in one body cut at BODY_S seconds (default 570: the device's
# limit is 600 s, or less when less device time is left, and pack_out must run); a piece that
# needs time takes what it is given or what is left:
#   suite           the whole single-GPU suite (tools/gpu_round.sh suite, 2 processes), SUITE_S
#                   (330) s each (r41's H100: 121 / 162 s; r42's: the second cut at 250 s)
#   bench:SHAPES[:S] the protocol with peers (jax_mok, B2, B3, B6, both FP8 recipes) on SHAPES
#                   (S4's FP8 rows need ~119 GiB: needs_h200), S seconds (default: what is left)
#                   (IMPLS, PASSES: the harness's --impls / --passes, default
#                   jax_mok,B2,B3,B6,fp8 / fwd,fwdbwd; S4's FP8 fwd+bwd alone: IMPLS=jax_mok,fp8
#                   PASSES=fwdbwd bench:S4:300; BENCH_EXTRA: more harness arguments, e.g.
#                   --no-ceilings where only the ratios to our BF16 of the run are wanted)
#   b6:SHAPES       Liger's own autotune (B6, --b6-autotune record) on SHAPES (PASSES), its winners
#                   written to the run's b6_configs.json (commit them here: python -m
#                   benchmarks.peers_liger record <results.json>); B6_ITEM_S an item (default 280;
#                   S2's forward search alone took 448 s on an H100, r39), what is left
#   profiles        the per-phase profile of each recipe in PROFILES (none fp8_block mxfp8) on
#                   S1, S2, S3, S6, 70 s each (tools/gpu_round.sh profile)
#   skew[:SHAPES]   jax_mok alone (BF16), skewed and balanced routing on SHAPES (S1-S6), issue 22's
#                   "skewed within 1.15x of balanced" (last measured at 2dc886d), 240 s
#   clocks          tools/gpu_round.sh clocks (the ceiling's dot, S1 and S6 fwd+bwd): one call
#                   alone after idle, the protocol's fresh measure, sustained load and after, 150 s
#   e2e             the e2e table: 4 layers, the padded einsum's largest batch from 2 down (on an
#                   H200 it ran out of memory at 4: a 123 GiB allocation, r22), jax_mok and
#                   fp8_block also at their own best batch up to 32 (both ran out of memory at 64,
#                   r22; E2E_CAP lowers that cap), step-time breakdown; E2E_TIMEOUT seconds (default:
#                   what is left less gpu_round.sh's set-up)
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: call.sh PIECE [PIECE...] (suite, bench:SHAPES[:S], b6:SHAPES, profiles, clocks, skew[:SHAPES], e2e)"; exit 2; }
export JAX_MOK_GIT_COMMIT=${JAX_MOK_GIT_COMMIT:?pass JAX_MOK_GIT_COMMIT=<head>}
export OUT EXT_DIR=.device/ext-main  # every piece's gpu_round.sh: the carried extension
BODY_S=${BODY_S:-570}
left() { echo $(( BODY_S - 10 - SECONDS )); }
bench() {  # bench SHAPES SECONDS
  ROUND_TAG=bench_${1//,/} BENCH_TIMEOUT=$2 BENCH_ARGS="--routing balanced --impls ${IMPLS:-jax_mok,B2,B3,B6,fp8} \
    --passes ${PASSES:-fwd,fwdbwd} --shapes $1 --budget-s $(( $2 - 30 )) --item-timeout-s 100 \
    ${BENCH_EXTRA:-}" \
    tools/gpu_round.sh bench
}
piece() {
  case $1 in
    suite)
      ROUND_TAG=suite SUITE_TIMEOUT=${SUITE_S:-330} tools/gpu_round.sh suite ;;
    bench:*)
      local spec=${1#bench:}
      local shapes=${spec%%:*} secs=$(left)
      [ "$spec" != "$shapes" ] && secs=${spec#*:}
      bench "$shapes" "$secs" ;;
    b6:*)
      local shapes=${1#b6:} secs=$(left)
      ROUND_TAG=b6_${shapes//,/} BENCH_TIMEOUT=$secs BENCH_ARGS="--routing balanced --impls B6 \
        --b6-autotune record --passes ${PASSES:-fwd,fwdbwd} --shapes $shapes --no-ceilings \
        --budget-s $(( secs - 30 )) --item-timeout-s ${B6_ITEM_S:-280}" tools/gpu_round.sh bench ;;
    profiles)
      ROUND_TAG=profiles PROFILE_SHAPES=S1,S2,S3,S6 PROFILE_QUANT="${PROFILES:-none fp8_block mxfp8}" \
        PROFILE_TIMEOUT=70 tools/gpu_round.sh profile ;;
    clocks)
      ROUND_TAG=clocks tools/gpu_round.sh clocks ;;
    skew|skew:*)
      local shapes=S1,S2,S3,S4,S5,S6; [ "$1" != skew ] && shapes=${1#skew:}
      ROUND_TAG=bench_skew BENCH_TIMEOUT=240 BENCH_ARGS="--routing skewed,balanced --impls jax_mok \
        --shapes $shapes --budget-s 210 --item-timeout-s 60" tools/gpu_round.sh bench ;;
    e2e)
      ROUND_TAG=e2e XLA_FLAGS=--xla_gpu_enable_command_buffer= E2E_TIMEOUT=${E2E_TIMEOUT:-$(( $(left) - 40 ))} \
        E2E_ARGS="--layers 4 --batch 2 --batch-policy shared --own-best \
        --own-best-variants jax_mok,jax_mok_fp8_block --own-best-cap ${E2E_CAP:-32} --breakdown --steps 5 \
        --warmup 2 --max-step-s 30" tools/gpu_round.sh e2e ;;
    *) echo "unknown piece $1"; return 2 ;;
  esac
}
body() {
  for p in "$@"; do
    echo "=== piece $p at ${SECONDS} s"
    piece "$p"
  done
}
export -f body piece bench left
export BODY_S
timeout $BODY_S bash -c 'body "$@"' body "$@"
echo "body rc=$?"
OUT=$OUT bash tools/pack_out.sh
