#!/bin/bash
# r15 call 1: ext-main = cdd2ba5's kernels, ext-pp = the BF16 wgmma GEMM as ping-pong consumers
# (each warpgroup its own 64-row half of a tile, the ring in half order). BF16 kernel tests on
# ext-pp, then BF16 timings and per-phase profiles of both, interleaved.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
cp .device/ext-pp/_mok_c*.so jax_mok/
XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_REQUIRE_CUDA=1 timeout 200 $PYTEST \
  tests/test_cuda_kernels.py tests/test_ffi_attributes_cuda.py > $OUT/unit_pp.log 2>&1
echo "unit pp: $(tail -1 $OUT/unit_pp.log)"; grep -E "^FAILED|^ERROR" $OUT/unit_pp.log | head
for round in 1 2; do
  for ext in main pp; do
    cp .device/ext-$ext/_mok_c*.so jax_mok/
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 90 python3 tools/kernel_timings.py timings \
      --shapes S1,S2,S3,S6 --quantization none > $OUT/timings_${ext}_$round.log 2>&1
    echo "timings $ext round $round rc=$?"; grep -E "^\| S[0-9] \|" $OUT/timings_${ext}_$round.log | cut -c1-160
  done
done
for ext in main pp; do
  cp .device/ext-$ext/_mok_c*.so jax_mok/
  JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 80 python3 tools/kernel_timings.py \
    profile --shapes S1,S2 --quantization none > $OUT/profile_$ext.txt 2>&1
  echo "profile $ext rc=$?"
done
python3 tools/kernel_timings.py compare $OUT/profile_main.txt $OUT/profile_pp.txt 2>&1 | tail -40
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log)
