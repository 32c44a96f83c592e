#!/bin/bash
# The next session's second device call (written in r17), right after next_call1.sh on the warm
# machine: r17 call 2's sweep on main's kernels (.device/ext-dev) and its fit, so the FP8
# mainloop's per-stage efficiency after 0a42b8b compares with r17's (60-67 % of the FP8 ceiling;
# BF16 85-100 %): call2/fit.md.
cp .device/ext-dev/_mok_c*.so jax_mok/
export PYTHONPATH=$PWD JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85
S=S1-H1024,S1,S1-H4096,S1-F384,S1-F1536
for q in none fp8_block; do
  timeout 200 python3 tools/kernel_timings.py profile --shapes $S --quantization $q \
    --fp8-weight-grads unquantized > $OUT/sweep_$q.log 2>&1
  echo "$q rc=$?"
done
python3 tools/kernel_timings.py fit $OUT/sweep_none.log $OUT/sweep_fp8_block.log | tee $OUT/fit.md
