#!/bin/bash
# r37's call for whichever one-GPU machine comes: on an H200 the first final-commit call of the
# r34 README (the suite, then the protocol with peers on S4-S6); on an H100 (78 GiB: S4's FP8
# rows do not fit) r34's ncu.sh diagnostic of the dy·Wdᵀ + SwiGLU-backward GEMM.
#   carry [".device/ext-main", ".whl"]; JAX_MOK_GIT_COMMIT=<head> OUT=$OUT bash docs/bench/2026-12-07-r37/any.sh
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
case $gpu in
  *H200*) bash docs/bench/2026-12-06-r34/call.sh suite bench:S4,S5,S6 ;;
  *) bash docs/bench/2026-12-06-r34/ncu.sh ;;
esac
