"""The custom_vjp around the local kernels (``mok_moe_fwd`` / ``mok_moe_bwd``) and its residual
policy.

Two residual policies (``save_activations``):
- saved (default on CUDA): the training forward (``mok_moe_fwd_train``) also writes the gate/up
  pre-activations h ``[T*k, 2F]`` in x's dtype, and the backward (``mok_moe_bwd_saved``) reads
  them instead of recomputing the gate/up GEMM (4*T*k*H*F FLOPs, 2/9 of a training step's).
  Costs T*k*2F elements of activation memory per layer (S1: 805 MB in bf16).
- recompute (the CPU backend; ``MoEConfig.save_activations=False``): residuals are the operands
  only; the backward recomputes h.
Routing ids are integers and get no cotangent; the router's gradient flows through
``topk_weights``. A forward without differentiation always runs the plain ``mok_moe_fwd``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_mok import reference
from jax_mok.kernels import _ffi, targets, vma
from jax_mok.tuning import KernelTuning, Tuning, resolve

IMPLEMENTATIONS = ("reference", "ffi", "cpu", "cuda")


def forward_keeping_h(kernel: KernelTuning, x2d, topk_ids, topk_weights, w_gate_up, w_down):
    """``(y, h)``, chosen per platform at lowering: the saving target exists for CUDA only, so
    elsewhere the plain forward runs and h is a zero placeholder (``backward_with_h`` then
    recomputes)."""

    def elsewhere(*args):
        tk = topk_ids.shape[0] * topk_ids.shape[1]
        return (targets.moe_forward(kernel)(*args),
                jnp.zeros((tk, w_gate_up.shape[-1]), x2d.dtype))

    return jax.lax.platform_dependent(
        x2d, topk_ids, topk_weights, w_gate_up, w_down,
        cuda=targets.moe_forward_train(kernel), default=elsewhere)


def backward_with_h(kernel: KernelTuning, *args):
    """``mok_moe_bwd_saved`` on CUDA; elsewhere the recomputing backward (h unused)."""
    return jax.lax.platform_dependent(
        *args, cuda=functools.partial(targets.moe_backward_saved, kernel),
        default=lambda *a: targets.moe_backward(kernel)(*a[:-1]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _kernel_experts(x2d, topk_ids, topk_weights, w_gate_up, w_down, save: bool,
                    kernel: KernelTuning):
    del save  # only the differentiated forward keeps h
    return targets.moe_forward(kernel)(x2d, topk_ids, topk_weights, w_gate_up, w_down)


def _kernel_experts_fwd(x2d, topk_ids, topk_weights, w_gate_up, w_down, save, kernel):
    operands = (x2d, topk_ids, topk_weights, w_gate_up, w_down)
    if save:
        y, h = forward_keeping_h(kernel, *operands)
    else:
        y, h = targets.moe_forward(kernel)(*operands), None
    return y, (*operands, h)


def _kernel_experts_bwd(save, kernel, residuals, dy):
    *operands, h = residuals
    args = (dy.astype(operands[0].dtype), *operands)
    if h is None:
        grads = targets.moe_backward(kernel)(*args)
    else:
        grads = backward_with_h(kernel, *args, h)
    x2d, _, topk_weights, w_gate_up, w_down = operands
    return (vma.cotangent_like(grads[0], x2d), None, vma.cotangent_like(grads[1], topk_weights),
            vma.cotangent_like(grads[2], w_gate_up), vma.cotangent_like(grads[3], w_down))


_kernel_experts.defvjp(_kernel_experts_fwd, _kernel_experts_bwd)


def resolve_save_activations(implementation: str, save: bool | None) -> bool:
    """The residual policy of a call: explicit, else saved where the kernels are CUDA's
    (``"cuda"``, or ``"ffi"`` with a GPU default backend). A computation that lands on the CPU
    with saving on (``"ffi"`` on a GPU machine, CPU devices) recomputes anyway
    (``forward_keeping_h``)."""
    if save and implementation == "cpu":
        raise ValueError(
            "jax_mok: save_activations=True needs the CUDA kernels, but implementation='cpu'; "
            "the CPU backend recomputes the gate/up GEMM in the backward (pass "
            "save_activations=False or None)"
        )
    if save is None:
        save = implementation == "cuda" or (
            implementation == "ffi" and jax.default_backend() == "gpu"
        )
    return bool(save)


def check_implementation(implementation: str) -> None:
    """Raises for an unknown implementation, ``"cpu"`` / ``"cuda"`` whose extension is not
    built, or ``"cuda"`` on a GPU the kernels do not run on (:func:`_ffi.cuda_device_limits`);
    registers the targets every platform of this process can lower for (``"ffi"``)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation in ("cpu", "cuda") and not _ffi.kernels_built(implementation):
        raise RuntimeError(
            f"jax_mok: implementation={implementation!r} but its extension _mok_{implementation} "
            "is not built (reinstall jax_mok; the CUDA one needs nvcc on PATH or JAX_MOK_CUDA=1)"
        )
    if implementation == "cuda" and (reason := _ffi.cuda_device_limits()) is not None:
        raise ValueError(f"jax_mok: implementation='cuda' but {reason}; use "
                         "implementation='reference' on this GPU")
    if implementation == "ffi":
        _ffi.register_targets()


def routed_experts(
    x2d: jax.Array,
    topk_ids: jax.Array,
    topk_weights: jax.Array,
    w_gate_up: jax.Array,
    w_down: jax.Array,
    *,
    implementation: str = "ffi",
    save_activations: bool | None = None,
    tuning: Tuning | None = None,
) -> jax.Array:
    """Routed expert computation after routing: ``y [T, H]`` in x's dtype.

    ``x2d [T, H]``, ``topk_ids [T, k]`` int32 (ids outside ``[0, E)`` are skipped),
    ``topk_weights [T, k]`` float32, ``w_gate_up [E, H, 2F]``, ``w_down [E, F, H]`` (x's dtype).
    ``implementation``: ``"reference"`` (pure JAX), ``"ffi"`` (the kernels registered for
    whatever platform the computation lands on), or ``"cpu"`` / ``"cuda"`` (the same targets, with
    a check that that backend is built).
    ``save_activations``: keep the gate/up pre-activations for the backward (T*k*2F elements)
    instead of recomputing them; None = saved on CUDA, recomputed on the CPU (module docstring).
    ``tuning``: :class:`jax_mok.Tuning` (its ``kernel`` part applies; None = the defaults and
    ``JAX_MOK_TUNING``).
    """
    if implementation == "reference":
        return reference.routed_experts(x2d, topk_ids, topk_weights, w_gate_up, w_down)
    check_implementation(implementation)
    save = resolve_save_activations(implementation, save_activations)
    kernel = resolve(tuning).kernel
    return _kernel_experts(x2d, topk_ids, topk_weights, w_gate_up, w_down, save, kernel)


__all__ = ["IMPLEMENTATIONS", "backward_with_h", "check_implementation", "forward_keeping_h",
           "resolve_save_activations", "routed_experts"]
