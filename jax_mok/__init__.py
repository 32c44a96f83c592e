"""jax_mok: a fused Mixture-of-Experts layer for JAX (XLA FFI kernels, custom_vjp, Flax)."""

from jax_mok import quantization, reference, routing, sharding
from jax_mok.api import moe
from jax_mok.config import MoEConfig
from jax_mok.params import MoEParams, init_params
from jax_mok.quantization import QuantizedWeight, quantize_params

__version__ = "0.1.0"

__all__ = ["MoEConfig", "MoEParams", "QuantizedWeight", "__version__", "init_params", "moe",
           "quantization", "quantize_params", "reference", "routing", "sharding"]
