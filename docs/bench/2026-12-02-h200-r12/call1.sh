#!/bin/bash
# Twelfth session, device call 1 (carry .device/ext = main's kernels, .whl = liger-kernel):
# where the FP8 GEMMs lose, from counters: ncu's full set (source counters included) of the two
# forward GEMMs of S1 in fp8_block (from master weights) and in bf16, each kernel's SASS with its
# stall samples exported; then B6's own autotune recorded for S6 (how long a search takes).
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cp .device/ext/_mok_c*.so jax_mok/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
ncu --version | tail -1
mkdir -p /tmp/n
ncu --query-metrics 2>/dev/null | grep -i -E "gmma|pipe_tensor|shared_op|bank_conf" > /tmp/n/metrics.txt
prof() {  # prof LABEL SHAPE QUANT KERNEL_REGEX
  XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD timeout 200 ncu --clock-control none \
    --set full --import-source no -k "regex:$4" --launch-count 2 -f -o /tmp/n/$1 \
    python3 tools/kernel_timings.py forward --shapes $2 --quantization $3 > /tmp/n/$1.log 2>&1
  echo "ncu $1 rc=$?"; tail -3 /tmp/n/$1.log
  ncu --import /tmp/n/$1.ncu-rep --print-details all > /tmp/n/$1.txt 2>&1
  ncu --import /tmp/n/$1.ncu-rep --page source --csv --print-source sass > /tmp/n/$1_sass.csv 2>&1
  echo "source rc=$? $(wc -l < /tmp/n/$1_sass.csv) lines"
  grep -E "fp8_gemm_kernel|wgmma_gemm_kernel|^    Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Eligible Warps|Warp Cycles Per Issued|Shared Memory|Bank|Tensor" /tmp/n/$1.txt | cut -c1-150 | head -60
}
prof fp8_S1 S1 fp8_block fp8_gemm_kernel
prof bf16_S1 S1 none wgmma_gemm_kernel
(cd /tmp/n && tar czf $OUT/ncu.tgz *.txt *.csv *.log metrics.txt)
cp /tmp/n/fp8_S1.ncu-rep $OUT/ 2>/dev/null
ls -la $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
t0=$(date +%s)
timeout 250 python3 -m benchmarks.run --b6-autotune record --impls B6 --routing balanced --shapes S6 \
  --no-ceilings --item-timeout-s 230 --budget-s 240 --out /tmp/b6-S6 > /tmp/b6-S6.log 2>&1
echo "b6 S6 rc=$? $(( $(date +%s) - t0 )) s"; tail -15 /tmp/b6-S6.log
(cd /tmp && tar czf $OUT/b6-S6.tgz b6-S6 b6-S6.log)
