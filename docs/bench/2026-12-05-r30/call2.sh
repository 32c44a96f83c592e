#!/bin/bash
# r30 call 2 (~5 min): the pair build with stage-scope barriers (ext-pair2) against main's
# kernels, and where kMxBf16's mainloop time goes.
#   carry [".device/ext-m28", ".device/ext-pair2", ".device/ext-mx"]
#   OUT=$OUT bash docs/bench/2026-12-05-r30/call2.sh
# Call 1 found the pair launch full (132 CTAs in 66 clusters), so the 1.4-2.1x was not idle SMs.
# The pair SASS has MEMBAR.ALL.GPU + ERRBAR before every remote stage arrival (cluster-scope
# release: 2 per stage per consumer warpgroup) and CCTL.IVALL after every producer thread's
# cluster-scope wait: ext-pair2 arrives and waits at CTA scope where nothing is published
# (cluster.cuh: mbar_arrive_remote).
# Predictions: ext-pair2 226/226 bitwise equal to ext-m28; S2 fp8_block routed-M GEMMs -5..-15 %
# against m28, S1 -5..+5 %; BF16 routed-M (pairs too) likewise. If still slower than m28: the
# pair protocol's lockstep itself costs; delete pairs.
# ncu (ext-mx, S1 mxfp8 forward, the gate/up kernel): shared-memory pipe utilization near 100 %
# (the conversion writes 24 KB and reads 12 KB of shared memory per 32-K step on top of the
# wgmmas' 40 KB and the ring's 12 KB: ~88 KB per 512-cycle step against 128 B/clock).
set -uo pipefail
keep() { (cd $OUT && for f in logs.tgz summary.txt; do [ -f $f ] && mv $f "${f%%.*}_$1.${f#*.}"; done); }
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=".device/ext-pair2" \
  tools/gpu_round.sh ab; keep ab
OUT=$OUT EXT_DIR=.device/ext-m28 AB_BASE=.device/ext-m28 AB_DEV=".device/ext-pair2" \
  AB_SHAPES=S1,S2 tools/gpu_round.sh profab; keep profab
export PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD PYTHONUNBUFFERED=1
cp .device/ext-mx/_mok_c*.so jax_mok/
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 90 ncu --clock-control none --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
  -k "regex:fp8_gemm_kernel" --launch-count 1 python3 tools/kernel_timings.py forward \
  --shapes S1 --quantization mxfp8 > $OUT/ncu_mx.log 2>&1
echo "ncu mx rc=$?"
grep -E "Duration|Shared|Throughput|Pipe|Stall|Warp Cycles|Issue" $OUT/ncu_mx.log | cut -c1-110 | head -40
