"""The routed-expert kernels as JAX functions.

- :mod:`jax_mok.kernels._ffi`: loads the native extensions and registers their XLA FFI targets.
- :mod:`jax_mok.kernels.targets`: every ``jax.ffi.ffi_call`` of jax_mok, with its operands,
  results and attributes (docs/ffi-contract.md).
- :mod:`jax_mok.kernels.autodiff`: the ``custom_vjp`` around the local kernels and its residual
  policy (``save_activations``); :func:`jax_mok.kernels.autodiff.routed_experts` is the entry.
"""
