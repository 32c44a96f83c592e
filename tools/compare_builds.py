"""Two builds of the CUDA extension, bitwise: for a kernel change that must not change one bit.

    python3 tools/compare_builds.py run OUT.npz     # this process's build: every output below
    python3 tools/compare_builds.py compare A.npz B.npz

`run` computes, for a fixed list of problems (seeded inputs; partial row and column tiles, skipped
and dropped slots, zero-token experts, S1-like and S2-like dimensions at small token counts), the
BF16 layer's forward (inference and training) and every gradient with saved and recomputed
activations, and both FP8 recipes' forward and gradients (saved and recomputed h, both
weight-gradient modes: the FP8 and the BF16 weight-gradient kernels). `compare`
exits 1 and names every output whose bytes differ, with its largest difference. Run `run` once
per build (each its own process: one extension per process), then `compare`.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

# (T, H, F, E, k, routing) for the BF16 layer; the FP8 kernels need H, F multiples of 128.
BF16_CASES = [
    (300, 128, 72, 6, 3, "balanced"),
    (700, 264, 200, 8, 2, "skewed"),
    (333, 256, 128, 8, 3, "dropped"),
    (200, 192, 64, 16, 2, "sparse"),
    (2048, 2048, 768, 16, 8, "balanced"),
    (512, 1024, 2048, 8, 4, "skewed"),
]
FP8_CASES = [
    (300, 256, 128, 6, 3, "balanced"),
    (700, 384, 256, 8, 2, "skewed"),
    (1024, 2048, 768, 16, 8, "balanced"),
    (512, 1024, 2048, 8, 4, "dropped"),
]


def problem(seed, T, H, F, E, k, routing):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, H)).astype(np.float32)
    wgu = (rng.standard_normal((E, H, 2 * F)) / np.sqrt(H)).astype(np.float32)
    wd = (rng.standard_normal((E, F, H)) / np.sqrt(F)).astype(np.float32)
    dy = rng.standard_normal((T, H)).astype(np.float32)
    if routing == "sparse":  # most experts get no tokens
        pool = np.array([1, E // 2, E - 1])
        ids = np.stack([rng.permutation(pool)[:k] for _ in range(T)])
    else:
        logits = rng.standard_normal((T, E))
        if routing == "skewed":
            logits[:, : max(1, E // 10)] += 2.5
        ids = np.argsort(-logits, axis=1)[:, :k]
        if routing == "dropped":
            ids = np.where(rng.random((T, k)) < 0.3, -1, ids)
    w = (rng.random((T, k)) + 0.1).astype(np.float32)
    bf = lambda a: jnp.asarray(a, jnp.bfloat16)
    return bf(x), jnp.asarray(ids, jnp.int32), jnp.asarray(w), bf(wgu), bf(wd), bf(dy)


def _vjp(fn):
    def f(x, ids, w, wgu, wd, dy):
        y, vjp = jax.vjp(lambda x, w, a, b: fn(x, ids, w, a, b), x, w, wgu, wd)
        return (y, *vjp(dy))

    return jax.jit(f)


def run(path: str, implementation: str = "cuda") -> None:
    from jax_mok.kernels import autodiff
    from jax_mok.quantization import cuda as fp8

    # A fallback to the pure-JAX layer (the FP8 path warns) would compare the wrong thing.
    warnings.simplefilter("error")
    from benchmarks import mok_internals

    print(mok_internals.extension_fingerprint(), flush=True)

    out = {}
    saves = (True, False) if implementation == "cuda" else (False,)  # saved h: CUDA only
    for n, case in enumerate(BF16_CASES):
        args = problem(100 + n, *case)
        for save in saves:
            fn = lambda x, ids, w, a, b, save=save: autodiff.routed_experts(
                x, ids, w, a, b, implementation=implementation, save_activations=save)
            for name, v in zip(("y", "dx", "dw", "dwgu", "dwd"), _vjp(fn)(*args), strict=True):
                out[f"bf16/{case}/save={save}/{name}"] = np.asarray(v)
        infer = jax.jit(lambda x, ids, w, a, b: autodiff.routed_experts(
            x, ids, w, a, b, implementation=implementation, save_activations=False))
        out[f"bf16/{case}/inference/y"] = np.asarray(infer(*args[:5]))
    for recipe in ("fp8_block", "mxfp8"):
        for n, case in enumerate(FP8_CASES):
            args = problem(200 + n, *case)
            for save in saves:
                for wgrad in ("fp8", "unquantized"):
                    fn = lambda x, ids, w, a, b, save=save, recipe=recipe, wgrad=wgrad: (
                        fp8.routed_experts_fp8(x, ids, w, a, b, recipe,
                                               implementation=implementation,
                                               save_activations=save, weight_grads=wgrad))
                    for name, v in zip(("y", "dx", "dw", "dwgu", "dwd"), _vjp(fn)(*args),
                                       strict=True):
                        out[f"{recipe}/{case}/save={save}/{wgrad}/{name}"] = np.asarray(v)
    np.savez(path, **{k: v.view(np.uint8) for k, v in out.items()},
             **{f"dtype::{k}": np.array(str(v.dtype)) for k, v in out.items()})
    print(f"{len(out)} outputs -> {path}")


def compare(a_path: str, b_path: str) -> int:
    a, b = np.load(a_path), np.load(b_path)
    keys = [k for k in a.files if not k.startswith("dtype::")]
    if set(keys) != {k for k in b.files if not k.startswith("dtype::")}:
        print("the two files hold different outputs")
        return 1
    bad = 0
    for k in keys:
        if np.array_equal(a[k], b[k]):
            continue
        bad += 1
        dtype = jnp.dtype(str(a[f"dtype::{k}"]))
        va = np.asarray(jnp.asarray(a[k].view(dtype), jnp.float32))
        vb = np.asarray(jnp.asarray(b[k].view(dtype), jnp.float32))
        frac = np.mean(a[k].view(dtype) != b[k].view(dtype)) if va.size else 0.0
        print(f"DIFFERS {k}: max |a-b| {np.nanmax(np.abs(va - vb)):.3e}, "
              f"{100 * frac:.3f} % of elements")
    print(f"{len(keys) - bad} of {len(keys)} outputs bitwise equal")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("run", "compare"))
    ap.add_argument("files", nargs="+")
    ap.add_argument("--implementation", default="cuda",
                    help="cpu: a check of this tool itself on a machine without a GPU")
    args = ap.parse_args()
    if args.what == "run":
        run(args.files[0], args.implementation)
    else:
        sys.exit(compare(*args.files[:2]))


if __name__ == "__main__":
    main()
