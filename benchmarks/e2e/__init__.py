"""End-to-end training benchmark: a decoder-only MoE transformer with Qwen3-30B-A3B's MoE
dimensions trained with optax, jax_mok's layer (BF16, and FP8: fp8_block, mxfp8) against the
pure-XLA reference and the padded einsum. Run ``python -m benchmarks.e2e.run --help``."""
