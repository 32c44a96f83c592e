#!/bin/bash
# Eleventh session, device call 1 (one nvidia-h200; carry=[".device/ext", ".device/ext-next"]):
# the FP8 smoke test, then the whole single-GPU suite, on branch wip/fp8-next's build
# (.device/ext-next: the ptxas-clean quarter pipeline and the dy·Wdᵀ epilogue that quantizes dh
# and w*a, built on the CPU machine for Python 3.12 / jax 0.11.2). Call 2 is call2.sh.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
cp .device/ext-next/_mok_c*.so jax_mok/ && echo "extension: .device/ext-next"
# A smoke test under a short limit first: the new epilogue synchronizes both consumer
# warpgroups (named barrier 2), and a hang must cost 2 minutes, not the suite's 5.
JAX_MOK_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout 120 python3 -m pytest -q -x tests/test_cuda_fp8.py \
  -k "saved_equals_recomputed or (matches_fp8_reference and 300)" > "$OUT/fp8_smoke_next.log" 2>&1
rc=$?; echo "fp8 smoke (next) rc=$rc"; tail -15 "$OUT/fp8_smoke_next.log"
[ $rc -eq 0 ] || exit 1
mkdir -p "$OUT/suite"
EXT_DIR=.device/ext-next OUT=$OUT/suite TAIL=2 bash tools/gpu_round.sh suite > "$OUT/suite.log" 2>&1
tail -6 "$OUT/suite.log"
