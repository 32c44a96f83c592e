#!/bin/bash
# r30 call 3 (~4 min): where the pair build still loses, and where kMxBf16's step goes.
#   carry [".device/ext-m28", ".device/ext-pair2", ".device/ext-mx"]
#   OUT=$OUT bash docs/bench/2026-12-05-r30/call3.sh
# ncu --set full (source counters) of S2 fp8_block's forward GEMMs (gate/up, down) on ext-m28 and
# ext-pair2, and of S1 mxfp8's gate/up on ext-mx. Prediction: pair2's L2 throughput per FLOP
# ~1/3 below m28's (B multicast) while its consumers wait longer on `full` (the lockstep: a stage
# is refilled when the slower CTA releases it); ext-mx's consumers stall at the per-step
# fence.proxy.async / consumer barrier more than on the conversion's shared-memory loads.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD PYTHONUNBUFFERED=1
prof() {  # ext shape recipe count
  cp .device/$1/_mok_c*.so jax_mok/
  n=ncu_$1_$2_$3
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 120 ncu --clock-control none --set full \
    --import-source no -k "regex:fp8_gemm_kernel" --launch-count $4 -f -o /tmp/$n python3 \
    tools/kernel_timings.py forward --shapes $2 --quantization $3 > /tmp/${n}_run.log 2>&1
  echo "$n rc=$?"
  ncu --import /tmp/$n.ncu-rep --print-details all > /tmp/${n}_details.log 2>&1
  ncu --import /tmp/$n.ncu-rep --page source --csv --print-source sass > /tmp/${n}_sass.csv 2>&1
  grep -E "fp8_gemm_kernel|^    Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Issue Slots Busy|Warp Cycles Per Issued" \
    /tmp/${n}_details.log | cut -c1-120
}
prof ext-m28 S2 fp8_block 2
prof ext-pair2 S2 fp8_block 2
prof ext-mx S1 mxfp8 1
cd /tmp && tar czf $OUT/ncu.tgz ncu_*_details.log ncu_*_sass.csv ncu_*_run.log
ls -la $OUT
