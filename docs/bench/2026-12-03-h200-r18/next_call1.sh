#!/bin/bash
# The next session's first device call (written in r18), carry [".device/r19-exts.tar.xz"] (the six
# builds below, xz: 7 MB instead of 67 over the 64-MiB carry limit; unpacked into .device/ first;
# rebuild with `tar cJf .device/r19-exts.tar.xz -C .device ext-dev ext-q ext-qrs ext-x1 ext-x3
# ext-x4`): candidate fixes, and where the FP8 mainloop's stage time goes (r18: 1.28-1.30 us
# per 128-K stage, 61-62 % of the FP8 ceiling, while BF16's stage with the same bytes is 0.82-0.90
# us). Timing-only diagnostic builds (wrong values; never merged; patches beside this script):
#   ext-x1  fp8_diag1_nopromo.patch: no promotion; each half accumulates over all K in the tensor
#           cores, stages pipelined with wait<1> as the BF16 consumer does (the feed with n128
#           halves, nothing of the promotion)
#   ext-x3  fp8_diag3_n256.patch: as x1 with one m64n256k32 chain per warpgroup (B stage stored
#           as 256 contiguous rows): the feed at BF16's wgmma shape
#   ext-x4  fp8_diag4_drain_only.patch: main's loop, each group's drain kept, its promotion (scale
#           loads, FFMAs) left out except at the tile's last stage
#   ext-q   fp8_quarters.patch, the candidate (correct values, expected bitwise equal to main):
#           each stage as four n64 quarters into two alternating 32-float tiles, each promotion
#           group promoted while the next runs (one drain per stage instead of one per group:
#           fp8_block 2 -> 1, mxfp8 8 -> 1; ptxas clean). Predicted: fp8_block GEMM phases -10
#           to -20 %, mxfp8 -20 to -40 %, if the drains are the loss; worse if re-reading A
#           four times per stage costs more shared-memory bandwidth than the drains did.
#   ext-qrs fp8_quarters_rs.patch: ext-q with A from registers (RS wgmma: the warpgroup's A stage
#           loaded once per stage by ldmatrix, read by all four quarters; 168 registers, no
#           spills). Also expected bitwise equal; the fix if ext-q is shared-memory bound.
# Readout (S1, S2 fp8_block GEMM phases against ext-dev): dev - x4 = the promotion's FFMA/LDS;
# x4 - x1 = the drains; x1 - x3 = n128 halves against n256. Predicted: x1 near BF16's per-stage
# time (GEMM phases -25..-35 %), x4 between, x3 a little under x1.
# Then the whole suite (this session's CPU commits), and, if the call has time left, ncu --set
# full of ext-dev's S1 fp8_block forward GEMMs with per-SASS stall samples (tools/gpu_round.sh
# ncu, r12's call 1 recipe; tools/ncu_sass.py reads the *_sass.log in ncu.tgz's logs.tgz).
# Returns profab_all.md, summary.txt, ncu.tgz, rest.tgz.
set -uo pipefail
tar xJf .device/r19-exts.tar.xz -C .device
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=$OUT EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV=".device/ext-q .device/ext-qrs" \
  tools/gpu_round.sh ab > $OUT/round_ab.log 2>&1
grep -h "outputs bitwise\|differ" $OUT/round_ab.log | tail -3
OUT=$OUT EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev \
  AB_DEV=".device/ext-q .device/ext-qrs .device/ext-x1 .device/ext-x3 .device/ext-x4" AB_SHAPES=S1,S2 \
  AB_QUANT=fp8_block PROFILE_TIMEOUT=90 tools/gpu_round.sh profab > $OUT/round.log 2>&1
OUT=$OUT/mx EXT_DIR=.device/ext-dev AB_BASE=.device/ext-dev AB_DEV=".device/ext-q .device/ext-qrs" \
  AB_SHAPES=S1,S2 AB_QUANT=mxfp8 PROFILE_TIMEOUT=90 tools/gpu_round.sh profab \
  > $OUT/round_mx.log 2>&1
cp $OUT/mx/profab_*_mxfp8.txt $OUT/
grep -hE "fp8 .*GEMM|total" $OUT/profab_*.txt
(cd $OUT && for f in profab_*.txt; do echo "## $f"; cat "$f"; done > profab_all.md && rm profab_*.txt)
# The whole single-GPU suite on main's kernels: r18's CPU commits after d9a9058 (quantize_params
# through the CUDA weight quantizer, with its new GPU bit test in tests/test_cuda_fp8_weights.py;
# the harness's AOT-compiled timed programs) are untested on a GPU until this passes.
OUT=$OUT/suite EXT_DIR=.device/ext-dev SUITE_TIMEOUT=240 tools/gpu_round.sh suite \
  > $OUT/suite_round.log 2>&1
tail -4 $OUT/suite/summary.txt
# ncu only if the call has time left (the 600-s limit): r12's counters are the fallback.
if [ $SECONDS -lt 420 ]; then
  OUT=$OUT/ncu EXT_DIR=.device/ext-dev NCU_SHAPE=S1 NCU_TIMEOUT=120 tools/gpu_round.sh ncu \
    > $OUT/ncu_round.log 2>&1
  (cd $OUT && tar czf ncu.tgz --remove-files ncu ncu_round.log)
fi
# At most 8 files come back: the rest in one archive.
(cd $OUT && tar czf rest.tgz --remove-files round.log round_ab.log round_mx.log mx suite \
  suite_round.log machine.txt logs.tgz)
ls $OUT
