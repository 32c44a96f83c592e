#!/usr/bin/env bash
# Builds the extensions on the CPU machine for a device call to carry (tools/gpu_round.sh's
# EXT_DIR, AB_BASE, AB_DEV): one build directory per variant, its modules copied into .device/.
#   PYTHON=/path/to/python3.12 tools/build_ext.sh NAME [-DVAR=VALUE ...]
# NAME: .device/ext-NAME receives _mok_cuda*.so and _mok_cpu*.so; build/ext-NAME keeps the build
# (incremental on the next call). The -D options go to CMake: a variant's build choices (an
# experiment's option, -DNAME=VALUE). PYTHON: a Python with the device machine's version and jax
# (the modules are built against its headers and ABI) and nanobind and nvidia-cutlass installed.
# The build log (ptxas -v) is build/ext-NAME.log; tools/check_ptxas.py runs on it and a finding
# stops the script before the copy.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: PYTHON=python3.12 tools/build_ext.sh NAME [-DVAR=VALUE ...]}
shift
PYTHON=${PYTHON:-python3}
dir=build/ext-$name
log=build/ext-$name.log
mkdir -p build
export PATH=/usr/local/cuda/bin:$PATH
cmake -G Ninja -S ffi -B "$dir" -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PYTHON" \
  -DJAX_MOK_CUDA=ON "$@" > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
cmake --build "$dir" -j "$(nproc)" >> "$log" 2>&1 || { grep -m 20 -E "error" "$log"; exit 1; }
# ALLOW_SPILLS: a regular expression of kernels allowed to spill (an experiment's, said why).
"$PYTHON" tools/check_ptxas.py "$log" --max-spill 16 ${ALLOW_SPILLS:+--allow-spills "$ALLOW_SPILLS"}
mkdir -p ".device/ext-$name"
cp "$dir"/_mok_c*.so ".device/ext-$name/"
echo "ext-$name: $(md5sum ".device/ext-$name"/_mok_cuda*.so | cut -c1-8)" \
  "($(du -sh ".device/ext-$name" | cut -f1))"
