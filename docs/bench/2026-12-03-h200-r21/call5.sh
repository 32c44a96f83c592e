#!/bin/bash
# r21 call 5, carry [".device/ext-dev", ".device/ext-wg"]: ext-wg = the weight-gradient GEMMs
# gathering their token-order operand themselves (routed-K with one operand by cp.async: x for
# dWgu, dy for dWd in the FP8 backward), no "gather x, dy into expert order" pass (BF16: dy only,
# which dy·Wd^T loads by TMA). Expected bitwise equal (the same bytes reach the same wgmmas).
# Predicted: S1 bf16 step −0.5 ms (x's half of the 1.04 ms gather), fp8_block step −1.0 ms; dW
# GEMMs within ±3 % if the cp.async producer keeps up. Then the BF16 kernel tests on ext-wg.
#   OUT=$OUT bash docs/bench/2026-12-03-h200-r21/call5.sh
OUT=$OUT EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV=.device/ext-wg \
  AB_SHAPES=S1,S2 AB_QUANT="none fp8_block" PROFILE_TIMEOUT=60 \
  tools/gpu_round.sh ab,profab > $OUT/round.txt 2>&1
(cd $OUT && for f in profab_*.txt; do echo "## $f"; cat "$f"; done > profab_all.md 2>/dev/null)
grep -hE "gather|dW|total" $OUT/profab_all.md
grep -E "^ab|^prof" $OUT/summary.txt
cp .device/ext-wg/_mok_c*.so jax_mok/
XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 150 \
  python3 -m pytest -q -p no:cacheprovider -x tests/test_cuda_kernels.py > $OUT/unit.log 2>&1
echo "unit on ext-wg: rc=$? $(tail -1 $OUT/unit.log)"
echo "done at ${SECONDS}s"
