#!/bin/bash
# r17 call 2: per-tile against per-stage cost of every GEMM phase (S1 with H and F varied: the
# gate/up and dy.Wd^T GEMMs keep their tile count and change K with H; down keeps its tile count
# per H and changes K with F), bf16 and fp8_block (unquantized weight gradients, the default).
cp .device/ext-dev/_mok_c*.so jax_mok/
export PYTHONPATH=$PWD JAX_MOK_CUDA_PROFILE=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.85
S=S1-H1024,S1,S1-H4096,S1-F384,S1-F1536
for q in none fp8_block; do
  timeout 200 python3 tools/kernel_timings.py profile --shapes $S --quantization $q \
    --fp8-weight-grads unquantized > $OUT/sweep_$q.log 2>&1
  echo "$q rc=$?"; grep -c "CUDA profile" $OUT/sweep_$q.log
done
