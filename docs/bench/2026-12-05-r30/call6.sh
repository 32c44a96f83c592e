#!/bin/bash
# r30 call 6 (~3 min): where the quantizer passes lose to the HBM copy (issue 21: >= 80 %;
# BENCHMARKS.md: fp8_block weights both layouts 75-84 %, x rows 63-69 % on an H200).
#   carry [".device/ext-main"]   OUT=$OUT bash docs/bench/2026-12-05-r30/call6.sh
# ncu --set full of the weight quantizer (both layouts, fp8_block; S1's first two launches: w_gate_up, w_down)
# and of the row quantizer, in tools/kernel_timings.py quantizers. Prediction: DRAM throughput
# ~75 % with the along-A stores (32-byte pieces of 128 different rows per warp) showing as the
# L2's write traffic and the SM's stall on the tile barrier between the loads and the stores.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD PYTHONUNBUFFERED=1
cp .device/ext-main/_mok_c*.so jax_mok/
prof() {  # name kernel-regex shape count
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 100 ncu --clock-control none --set full \
    --import-source no -k "regex:$2" --launch-count $4 -f -o /tmp/$1 python3 \
    tools/kernel_timings.py quantizers --shapes $3 --quantization fp8_block > /tmp/$1_run.log 2>&1
  echo "$1 rc=$?"
  ncu --import /tmp/$1.ncu-rep --print-details all > /tmp/$1_details.log 2>&1
  ncu --import /tmp/$1.ncu-rep --page source --csv --print-source sass > /tmp/$1_sass.csv 2>&1
  grep -E "_kernel|^    Duration|DRAM Throughput|L2 Cache Throughput|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy" \
    /tmp/$1_details.log | cut -c1-120 | head -24
}
prof qw_S1 quantize_weight_kernel S1 2
prof qr_S1 quantize_rows_kernel S1 2
cd /tmp && tar czf $OUT/ncu_quant.tgz qw_*_details.log qr_*_details.log qw_*_sass.csv qr_*_sass.csv *_run.log
