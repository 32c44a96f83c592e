"""Call 2's diagnosis of the bf16 parity failures of call 1: quantizer bits (CUDA, XLA:GPU,
XLA:CPU) and the FP8 kernels' y against the pure-JAX layer run by XLA:GPU and by XLA:CPU."""

import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, "tests")
from test_cuda_kernels import _problem  # noqa: E402

from jax_mok.kernels import _ffi, targets  # noqa: E402
from jax_mok.quantization import blocks, layer  # noqa: E402

_ffi.cuda_module()
cpu = jax.devices("cpu")[0]


def bits(a):
    return np.asarray(a).view(np.uint8)


def same(xs, ys):
    return all(np.array_equal(bits(a), bits(b)) for a, b in zip(xs, ys, strict=True))


def rel(a, b):
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def weight(a, r):
    q = blocks.QuantizedWeight.quantize(a, r, 1)
    return q.values, q.scales


CASES = [(700, 128, 128, 8, 2, "one_expert"), (2048, 1024, 512, 16, 4, "skewed"),
         (300, 256, 256, 8, 2, "balanced")]
for T, H, F, E, k, kind in CASES:
    x, ids, w, wgu, wd, dy = _problem(T + E, T, H, F, E, k, jnp.bfloat16, kind)
    r = "fp8_block"
    xq_cuda = targets.quantize_rows(x, r)
    xq_gpu = jax.jit(lambda a: blocks.quantize(a, r))(x)  # noqa: B023
    with jax.default_device(cpu):
        xq_cpu = blocks.quantize(jax.device_put(x, cpu), r)
    wq_cuda = targets.quantize_weight(wgu, r, 1)
    wq_gpu = jax.jit(lambda a: weight(a, r))(wgu)  # noqa: B023
    print(kind, "x cuda==cpu", same(xq_cuda, xq_cpu), "x gpu==cpu", same(xq_gpu, xq_cpu),
          "w cuda==xlagpu", same(wq_cuda, wq_gpu))
    wdq = targets.quantize_weight(wd, r, 1)
    y_cuda, _ = targets.fp8_forward(xq_cuda, ids, w, wq_cuda, wdq, r, x.dtype, False)
    wdq_gpu = jax.jit(lambda a: weight(a, r))(wd)  # noqa: B023
    y_gpuq, _ = targets.fp8_forward(xq_gpu, ids, w, wq_gpu, wdq_gpu, r, x.dtype, False)
    print(kind, "y(cuda quant) == y(xla quant):", np.array_equal(bits(y_cuda), bits(y_gpuq)))
    ref_gpu = jax.jit(lambda *a: layer.routed_experts_fp8(*a, r))(x, ids, w, wgu, wd)  # noqa: B023
    with jax.default_device(cpu):
        args = [jax.device_put(a, cpu) for a in (x, ids, w, wgu, wd)]
        ref_cpu = layer.routed_experts_fp8(*args, r)
    print(kind, f"rel y vs ref_gpu {rel(y_cuda, ref_gpu):.3e} vs ref_cpu "
          f"{rel(y_cuda, ref_cpu):.3e}; ref_gpu vs ref_cpu {rel(ref_gpu, ref_cpu):.3e}")
    y32, _ = targets.fp8_forward(xq_cuda, ids, w, wq_cuda, wdq, r, jnp.float32, False)
    print(kind, f"rel y(f32 out) vs ref_gpu {rel(y32, ref_gpu):.3e}")
