"""jax_mok: a fused Mixture-of-Experts layer for JAX (XLA FFI kernels, custom_vjp, Flax).

The layers, bottom-up (docs/architecture.md): ``config``, ``params``, ``tuning`` -> ``routing``
-> ``reference`` -> ``kernels`` -> ``ep`` -> ``api`` -> ``nnx`` / ``linen``. The FP8 package
``quantization`` has a module at four of them (its docstring maps it).
"""

from jax_mok import ep, hf, optim, quantization, reference, routing, sharding, tuning
from jax_mok.api import moe
from jax_mok.config import MoEConfig
from jax_mok.params import MoEParams, init_params
from jax_mok.quantization import QuantizedWeight
from jax_mok.quantization.weights import Fp8Weights, fp8_weights, quantize_params
from jax_mok.tuning import KernelTuning, PeerTuning, Tuning

__version__ = "0.1.0"

__all__ = ["Fp8Weights", "KernelTuning", "MoEConfig", "MoEParams", "PeerTuning", "QuantizedWeight",
           "Tuning", "__version__", "ep", "fp8_weights", "hf", "init_params", "moe", "optim",
           "quantization", "quantize_params", "reference", "routing", "sharding", "tuning"]
