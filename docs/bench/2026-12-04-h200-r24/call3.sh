#!/bin/bash
# Call 3 (one nvidia-h200, ~8 min), carry [".device/ext-deep", ".device/ext-final", ".whl"]:
#   JAX_MOK_GIT_COMMIT=<hash> OUT=$OUT bash docs/bench/2026-12-04-h200-r24/call3.sh
# ext-deep = main at c501ae3; ext-final = c501ae3 + trim.patch (a weight-gradient tile's tail
# k-block runs only the 16-position wgmma steps that hold positions) + wq.patch (the expert-weight
# quantizer: persistent CTAs, cp.async two tiles ahead, each value quantized once). The two touch
# different phases (dW GEMMs; quantize expert weights), so one build A/Bs both.
# Predicted: S2 dWgu/dWd −5..−8 %; S2 fp8_block weight quantization 10.6 + 5.3 → ~8.6 + ~4.35 ms
# (≈ 3.5 TB/s); bitwise equal; then the whole single-GPU suite on ext-final.
set -uo pipefail
OUT=$OUT EXT_DIR=.device/ext-deep AB_BASE=.device/ext-deep AB_DEV=.device/ext-final \
  AB_SHAPES=S2,S1 AB_QUANT="none fp8_block" tools/gpu_round.sh ab,profab,quant,suite
