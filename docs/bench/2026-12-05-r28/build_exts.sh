#!/bin/bash
# The four extensions the next calls carry, built on the CPU machine (~6 min on 2 cores):
#   PYTHON=<python3.12 with jax 0.11.2, nanobind, nvidia-cutlass> \
#     bash docs/bench/2026-12-05-r28/build_exts.sh
# A Python for it, where none is at hand (the device machine runs Python 3.12, jax 0.11.2):
#   python3.12 -m venv /tmp/venv312 && /tmp/venv312/bin/pip install "jax==0.11.2" nanobind \
#     numpy ninja cmake nvidia-cutlass==4.2.0.0 && PYTHON=/tmp/venv312/bin/python ...
set -euo pipefail
cd "$(dirname "$0")/../../.."
: "${PYTHON:?set PYTHON to a python3.12 with jax 0.11.2, nanobind and nvidia-cutlass}"
export PYTHON
tools/build_ext.sh m28
tools/build_ext.sh pair -DJAX_MOK_FP8_CLUSTER=2 -DJAX_MOK_BF16_CLUSTER=2
tools/build_ext.sh epi -DJAX_MOK_FP8_FUSE_DH=1 -DJAX_MOK_FP8_TMA_STORES=1
# ewg: the dy·Wd^T kernels (FP8 fp8_block and BF16) with the epilogue warpgroup spill 30-90 bytes
# (docs/perf-notes.md, twenty-eighth session)
ALLOW_SPILLS='gemm_kernelIL.*(Epi8E2E13__nv_bfloat16|ModeE1ELNS0_3EpiE4E)' \
  tools/build_ext.sh ewg -DJAX_MOK_FP8_EPI_WG=1 -DJAX_MOK_BF16_EPI_WG=1 -DJAX_MOK_FP8_FUSE_DH=1 \
  -DJAX_MOK_FP8_TMA_STORES=1
# The wheels the device machine installs offline (tools/gpu_round.sh: .whl/*.whl).
ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1 || "$PYTHON" -m pip download -q --no-deps \
  --python-version 3.12 --only-binary=:all: nvidia-cutlass==4.2.0.0 -d .whl
du -sh .device/ext-m28 .device/ext-pair .device/ext-epi .device/ext-ewg .whl
