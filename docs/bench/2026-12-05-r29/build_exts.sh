#!/bin/bash
# The three extensions call2.sh carries, built on the CPU machine (~4 min on 2 cores):
#   PYTHON=<python3.12 with jax 0.11.2, nanobind, nvidia-cutlass> \
#     bash docs/bench/2026-12-05-r29/build_exts.sh
# A Python for it, where none is at hand (the device machine runs Python 3.12, jax 0.11.2):
#   python3.12 -m venv /tmp/venv312 && /tmp/venv312/bin/pip install "jax==0.11.2" nanobind \
#     numpy ninja cmake nvidia-cutlass==4.2.0.0 && PYTHON=/tmp/venv312/bin/python ...
# ext-m28: main's default kernels (the name kept from r28: the same kernels, tools/ptx_compare.py).
set -euo pipefail
cd "$(dirname "$0")/../../.."
: "${PYTHON:?set PYTHON to a python3.12 with jax 0.11.2, nanobind and nvidia-cutlass}"
export PYTHON
tools/build_ext.sh m28
tools/build_ext.sh pair -DJAX_MOK_FP8_CLUSTER=2 -DJAX_MOK_BF16_CLUSTER=2
tools/build_ext.sh mx -DJAX_MOK_MX_BF16=1
du -sh .device/ext-m28 .device/ext-pair .device/ext-mx
