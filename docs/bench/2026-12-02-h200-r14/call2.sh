#!/bin/bash
# r14 call 2: ext-wg = main 3f23e56 + docs/bench/next/fp8_unquantized_weight_grads.patch only
# (call 1's other changes lost their A/B). Tests, then S1/S2 timings with both weight-grad modes.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD
cp .device/ext-wg/_mok_c*.so jax_mok/
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 250 $PYTEST \
  tests/test_cuda_kernels.py tests/test_ffi_attributes_cuda.py > $OUT/unit.log 2>&1 &
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 JAX_MOK_REQUIRE_CUDA=1 timeout 250 $PYTEST \
  tests/test_cuda_fp8.py tests/test_cuda_fp8_weights.py tests/test_fp8_weights.py > $OUT/fp8.log 2>&1
wait
echo "unit: $(tail -1 $OUT/unit.log)"; echo "fp8: $(tail -1 $OUT/fp8.log)"
grep -E "^FAILED|^ERROR" $OUT/unit.log $OUT/fp8.log | head
for wg in fp8 unquantized; do
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 timeout 100 python3 tools/kernel_timings.py timings --shapes S1,S2 \
    --quantization none,fp8_block --fp8-runs fwdbwd,fwdbwd_prep --fp8-weight-grads $wg > $OUT/timings_$wg.log 2>&1
  echo "timings $wg rc=$?"; grep -E "^\| S[0-9] \||ceiling" $OUT/timings_$wg.log | cut -c1-200
done
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log)
