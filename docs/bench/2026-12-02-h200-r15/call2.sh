#!/bin/bash
# r15 call 2: ext-pp = docs/bench/next/pingpong_bf16.patch (second version: per-consumer full
# barriers) on cdd2ba5. BF16 kernel tests under a timeout first, then S1/S2 BF16 timings, main vs pp.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD
PYTEST="python3 -m pytest -v -p no:cacheprovider -rfE -x"
cp .device/ext-pp/_mok_c*.so jax_mok/
XLA_PYTHON_CLIENT_MEM_FRACTION=0.8 JAX_MOK_REQUIRE_CUDA=1 timeout 240 $PYTEST \
  tests/test_cuda_kernels.py tests/test_ffi_attributes_cuda.py > $OUT/unit_pp.log 2>&1
rc=$?; echo "unit pp rc=$rc: $(tail -1 $OUT/unit_pp.log)"; grep -cE "PASSED" $OUT/unit_pp.log; tail -2 $OUT/unit_pp.log | cut -c1-150; grep -E "^FAILED|^ERROR" $OUT/unit_pp.log | head
if [ $rc -eq 0 ]; then
  for ext in main pp; do
    cp .device/ext-$ext/_mok_c*.so jax_mok/
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 70 python3 tools/kernel_timings.py timings \
      --shapes S1,S2 --quantization none > $OUT/timings_$ext.log 2>&1
    echo "timings $ext rc=$?"; grep -E "^\| S[0-9] \|" $OUT/timings_$ext.log | cut -c1-160
  done
  cp .device/ext-pp/_mok_c*.so jax_mok/
  JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 60 python3 tools/kernel_timings.py \
    profile --shapes S1 --quantization none > $OUT/profile_pp.txt 2>&1
  echo "profile pp rc=$?"; grep -E "gate|down|dy|dh|dW|gather" $OUT/profile_pp.txt | head -20
fi
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log)
