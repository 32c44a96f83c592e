"""Loads the Bazel-built ``_mok_cpu.so`` into jax and checks ``mok_moe_fwd`` against numpy.

The library is loaded by file path (not through ``import jax_mok``, which could find a pip/editable
install first), its capsules are registered with jax, and one forward call is compared with a
float64 numpy evaluation of the same MoE.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import pathlib
import sys

import numpy as np


def _library() -> pathlib.Path:
    candidates = []
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        workspace = os.environ.get("TEST_WORKSPACE", "jax_mok")
        candidates.append(pathlib.Path(srcdir) / workspace / "jax_mok" / "_mok_cpu.so")
    candidates.append(pathlib.Path(__file__).resolve().parents[2] / "bazel-bin" / "jax_mok"
                      / "_mok_cpu.so")
    for path in candidates:
        if path.exists():
            return path
    raise FileNotFoundError(f"_mok_cpu.so not found in {[str(c) for c in candidates]}")


def main() -> int:
    path = _library()
    loader = importlib.machinery.ExtensionFileLoader("_mok_cpu", str(path))
    spec = importlib.util.spec_from_file_location("_mok_cpu", str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)

    import jax
    import jax.numpy as jnp

    for name, capsule in module.registrations().items():
        jax.ffi.register_ffi_target(f"bazel_{name}", capsule, platform="cpu")

    rng = np.random.default_rng(0)
    T, H, F, E, k = 16, 8, 4, 4, 2
    x = rng.standard_normal((T, H), np.float32)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    ids[0, 1] = -1  # a skipped (dropped) assignment
    w = rng.random((T, k), np.float32)
    w_gate_up = rng.standard_normal((E, H, 2 * F), np.float32) / np.sqrt(H)
    w_down = rng.standard_normal((E, F, H), np.float32) / np.sqrt(F)

    call = jax.ffi.ffi_call("bazel_mok_moe_fwd", jax.ShapeDtypeStruct((T, H), jnp.float32))
    # The kernel targets take the tuning attributes (ffi/common/bindings.h AppendKernelAttrs);
    # the CPU backend reads neither, but XLA's FFI checks that every declared attribute is passed.
    got = np.asarray(jax.jit(lambda *a: call(*a, pregather_x=np.int32(0), gemm=np.int32(0)))(
        x, ids, w, w_gate_up, w_down))

    want = np.zeros((T, H))
    for t in range(T):
        for j in range(k):
            e = ids[t, j]
            if e < 0:
                continue
            h = x[t].astype(np.float64) @ w_gate_up[e]
            a = h[:F] / (1 + np.exp(-h[:F])) * h[F:]
            want[t] += w[t, j] * (a @ w_down[e])
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"loaded {path}; threads {module.num_threads()}; mok_moe_fwd rel error {err:.2e}")
    if not err < 1e-4:
        print("FAIL: the Bazel-built kernel disagrees with numpy", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
