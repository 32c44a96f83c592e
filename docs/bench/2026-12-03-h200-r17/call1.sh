#!/bin/bash
# r17 call 1: main (997eb5a's kernels, .device/ext-dev) against 26b0773 (.device/ext-base)
# bitwise, then the whole single-GPU suite on main's kernels: the first GPU run of 75fe7d8,
# 427217d, ba315d1, 42f5cc3.
OUT=$OUT EXT_DIR=.device/ext-dev SUITE_TIMEOUT=300 tools/gpu_round.sh ab,suite > $OUT/round.log 2>&1
tail -8 $OUT/summary.txt
