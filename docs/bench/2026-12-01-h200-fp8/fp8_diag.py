"""Where does the bf16 parity error of the failing fp8_block cases come from?"""
import sys
sys.path.insert(0, "tests")
import numpy as np
import jax, jax.numpy as jnp
from test_cuda_kernels import _problem
from jax_mok.kernels import _ffi, targets
from jax_mok.quantization import blocks, layer, cuda
_ffi.cuda_module()
cpu = jax.devices("cpu")[0]

def bits(a):
    return np.asarray(a).view(np.uint8)

def rel(a, b):
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64); b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

for (T, H, F, E, k, kind) in [(700, 128, 128, 8, 2, "one_expert"), (2048, 1024, 512, 16, 4, "skewed"), (300, 256, 256, 8, 2, "balanced")]:
    x, ids, w, wgu, wd, dy = _problem(T + E, T, H, F, E, k, jnp.bfloat16, kind)
    r = "fp8_block"
    # quantizer bits: CUDA vs XLA:GPU vs XLA:CPU
    xq_cuda = targets.quantize_rows(x, r)
    xq_gpu = jax.jit(lambda a: blocks.quantize(a, r))(x)
    with jax.default_device(cpu):
        xq_cpu = blocks.quantize(jax.device_put(x, cpu), r)
    wq_cuda = targets.quantize_weight(wgu, r, 1)
    wq_gpu = jax.jit(lambda a: (lambda q: (q.values, q.scales))(blocks.QuantizedWeight.quantize(a, r, 1)))(wgu)
    print(kind, "x cuda==cpu", all(np.array_equal(bits(a), bits(b)) for a, b in zip(xq_cuda, xq_cpu)),
          "x gpu==cpu", all(np.array_equal(bits(a), bits(b)) for a, b in zip(xq_gpu, xq_cpu)),
          "w cuda==xlagpu", all(np.array_equal(bits(a), bits(b)) for a, b in zip(wq_cuda, wq_gpu)))
    # y of the kernels with the two quantizers' operands
    wdq = targets.quantize_weight(wd, r, 1)
    y_cuda, _ = targets.fp8_forward(xq_cuda, ids, w, wq_cuda, wdq, r, x.dtype, False)
    wdq_gpu = jax.jit(lambda a: (lambda q: (q.values, q.scales))(blocks.QuantizedWeight.quantize(a, r, 1)))(wd)
    y_gpuq, _ = targets.fp8_forward(xq_gpu, ids, w, wq_gpu, wdq_gpu, r, x.dtype, False)
    print(kind, "y(cuda quant) == y(xla quant):", np.array_equal(bits(y_cuda), bits(y_gpuq)))
    ref_gpu = jax.jit(lambda *a: layer.routed_experts_fp8(*a, r))(x, ids, w, wgu, wd)
    with jax.default_device(cpu):
        ref_cpu = layer.routed_experts_fp8(*[jax.device_put(a, cpu) for a in (x, ids, w, wgu, wd)], r)
    print(kind, "rel y vs ref_gpu %.3e vs ref_cpu %.3e; ref_gpu vs ref_cpu %.3e" % (rel(y_cuda, ref_gpu), rel(y_cuda, ref_cpu), rel(ref_gpu, ref_cpu)))
    # float32 y (no final bf16 rounding) to separate the output rounding
    y32, _ = targets.fp8_forward(xq_cuda, ids, w, wq_cuda, wdq, r, jnp.float32, False)
    print(kind, "rel y(f32 out) vs ref_gpu %.3e" % rel(y32, ref_gpu))
    # a(SwiGLU) is quantized in the epilogue from float32 h; a bf16-h variant would differ
