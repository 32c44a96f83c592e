"""MoEConfig: the static description of one MoE layer."""

from __future__ import annotations

import dataclasses
import math

_ROUTINGS = ("softmax", "sigmoid")
_ACTIVATIONS = ("swiglu",)
_ROUTER_PRECISIONS = ("highest", "high", "default")
_QUANTIZATIONS = (None, "mxfp8", "fp8_block")
_FP8_WEIGHT_GRADIENTS = ("fp8", "unquantized")


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Static configuration of a Mixture-of-Experts layer.

    Args:
      num_experts: routed experts E.
      top_k: experts per token k, ``1 <= k <= E``.
      hidden_size: model width H (the last dim of ``x``).
      ffn_size: hidden width F of each routed expert's SwiGLU MLP.
      routing: ``"softmax"`` (Mixtral/Qwen) or ``"sigmoid"`` (DeepSeek-V3: experts are selected by
        ``sigmoid(logits) + router_bias``, weighted by ``sigmoid(logits)``).
      norm_topk_prob: renormalise the k selected scores to sum to one.
      routed_scaling_factor: multiplies the routing weights after normalisation.
      n_group, topk_group: group-limited routing (DeepSeek-V3): experts are split into ``n_group``
        equal groups, a group scores the sum of its two best selection scores, and only experts of
        the ``topk_group`` best groups can be selected. Both or neither must be set.
      num_shared_experts: always-on experts, fused into one SwiGLU MLP of width
        ``num_shared_experts * shared_ffn_size``.
      shared_ffn_size: width of one shared expert (defaults to ``ffn_size``).
      shared_expert_gate: scale the shared expert's output per token by
        ``sigmoid(x @ shared_gate)`` (Qwen2-MoE; ``MoEParams.shared_gate [H, 1]``, float32).
        Needs ``num_shared_experts >= 1``.
      capacity_factor: ``None`` is dropless. Otherwise each expert keeps at most
        ``ceil(capacity_factor * T * k / E)`` assignments, earliest tokens first.
      activation: only ``"swiglu"`` today.
      save_activations: training residuals of the kernels. ``True`` keeps the gate/up
        pre-activations (``T * k * 2F`` elements per layer in x's dtype) so the backward skips
        their recompute; ``False`` recomputes them (less memory, ~2/9 more GEMM FLOPs per
        training step); ``None``: saved on CUDA, recomputed on the CPU.
      router_precision: the router GEMM's ``jax.lax.Precision`` on float32 operands.
        ``"highest"`` (default): exact float32 logits (on a GPU a CUDA-core SGEMM: 0.6 ms of
        the S2 forward at 8192 tokens on an H200); ``"high"``: three bfloat16 passes on the
        tensor cores (about float32 accuracy); ``"default"``: one reduced-precision pass
        (TF32-like), which can flip the choice between nearly tied experts.
      quantization: ``None`` (the expert GEMMs in x's dtype), ``"mxfp8"`` (OCP MX: E4M3 values,
        one power-of-two scale per 32 elements along each GEMM's reduction axis) or
        ``"fp8_block"`` (DeepSeek-V3: E4M3 values, float32 scales per 1 x 128 activation block
        and 128 x 128 weight tile). Routing, the shared expert and accumulation are unchanged;
        see :mod:`jax_mok.quantization.layer` for the exact semantics (the CUDA FP8 kernels
        compute it on Hopper, the pure-JAX layer elsewhere; docs/fp8.md).
      fp8_weight_gradients: with ``quantization``, how the two expert weight gradients are
        computed. ``"fp8"``: FP8 GEMMs on their operands quantized along each expert's tokens
        (the recipe's 32 x 1 / 128 x 1 token blocks). ``"unquantized"``: GEMMs in x's dtype on
        the operands as they are (x, dy, w·a and dh; float32 accumulation), as the BF16 layer
        computes them: more accurate weight gradients, and on Hopper no token-wise quantization
        pass; faster on every measured shape (docs/fp8.md). ``None`` (default):
        ``"unquantized"``, except under expert parallelism, where the token rows travel
        quantized and only ``"fp8"`` exists (a one-time warning says so; set the field to get
        the same gradients on every mesh). The forward and the data gradients are FP8 either
        way.
    """

    num_experts: int
    top_k: int
    hidden_size: int
    ffn_size: int
    routing: str = "softmax"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_group: int | None = None
    topk_group: int | None = None
    num_shared_experts: int = 0
    shared_ffn_size: int | None = None
    shared_expert_gate: bool = False
    capacity_factor: float | None = None
    activation: str = "swiglu"
    save_activations: bool | None = None
    router_precision: str = "highest"
    quantization: str | None = None
    fp8_weight_gradients: str | None = None

    def __post_init__(self):
        def positive_int(name):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MoEConfig.{name} must be a positive int, got {value!r}")

        for name in ("num_experts", "top_k", "hidden_size", "ffn_size"):
            positive_int(name)
        if self.top_k > self.num_experts:
            raise ValueError(
                f"MoEConfig.top_k must be in [1, num_experts={self.num_experts}], "
                f"got {self.top_k}"
            )
        if self.routing not in _ROUTINGS:
            raise ValueError(f"MoEConfig.routing must be one of {_ROUTINGS}, got {self.routing!r}")
        if self.router_precision not in _ROUTER_PRECISIONS:
            raise ValueError(
                f"MoEConfig.router_precision must be one of {_ROUTER_PRECISIONS}, "
                f"got {self.router_precision!r}"
            )
        if self.quantization not in _QUANTIZATIONS:
            raise ValueError(
                f"MoEConfig.quantization must be one of {_QUANTIZATIONS}, "
                f"got {self.quantization!r}"
            )
        if self.fp8_weight_gradients not in (None, *_FP8_WEIGHT_GRADIENTS):
            raise ValueError(
                f"MoEConfig.fp8_weight_gradients must be None or one of {_FP8_WEIGHT_GRADIENTS}, "
                f"got {self.fp8_weight_gradients!r}"
            )
        if self.activation not in _ACTIVATIONS:
            raise ValueError(
                f"MoEConfig.activation must be one of {_ACTIVATIONS}, got {self.activation!r}"
            )
        if not math.isfinite(self.routed_scaling_factor):
            raise ValueError(
                "MoEConfig.routed_scaling_factor must be finite, "
                f"got {self.routed_scaling_factor!r}"
            )
        if (self.n_group is None) != (self.topk_group is None):
            raise ValueError(
                "MoEConfig.n_group and topk_group must be set together, got "
                f"n_group={self.n_group!r}, topk_group={self.topk_group!r}"
            )
        if self.n_group is not None:
            positive_int("n_group")
            positive_int("topk_group")
            if self.num_experts % self.n_group:
                raise ValueError(
                    f"MoEConfig.num_experts={self.num_experts} must be divisible by "
                    f"n_group={self.n_group}"
                )
            if self.topk_group > self.n_group:
                raise ValueError(
                    f"MoEConfig.topk_group={self.topk_group} must be <= n_group={self.n_group}"
                )
            per_group = self.num_experts // self.n_group
            if self.topk_group * per_group < self.top_k:
                raise ValueError(
                    f"MoEConfig: topk_group={self.topk_group} groups of {per_group} experts "
                    f"cannot supply top_k={self.top_k} experts"
                )
        if (
            isinstance(self.num_shared_experts, bool)
            or not isinstance(self.num_shared_experts, int)
            or self.num_shared_experts < 0
        ):
            raise ValueError(
                "MoEConfig.num_shared_experts must be an int >= 0, "
                f"got {self.num_shared_experts!r}"
            )
        if self.shared_ffn_size is not None:
            positive_int("shared_ffn_size")
            if self.num_shared_experts == 0:
                raise ValueError(
                    "MoEConfig.shared_ffn_size is set but num_shared_experts is 0; "
                    "set num_shared_experts >= 1 or leave shared_ffn_size=None"
                )
        if not isinstance(self.shared_expert_gate, bool):
            raise ValueError(
                "MoEConfig.shared_expert_gate must be True or False, "
                f"got {self.shared_expert_gate!r}"
            )
        if self.shared_expert_gate and self.num_shared_experts == 0:
            raise ValueError(
                "MoEConfig.shared_expert_gate=True gates the shared expert, but "
                "num_shared_experts is 0; set num_shared_experts >= 1"
            )
        if self.save_activations not in (None, True, False):
            raise ValueError(
                "MoEConfig.save_activations must be None, True or False, "
                f"got {self.save_activations!r}"
            )
        if self.capacity_factor is not None and not (
            isinstance(self.capacity_factor, int | float)
            and math.isfinite(self.capacity_factor)
            and self.capacity_factor > 0
        ):
            raise ValueError(
                "MoEConfig.capacity_factor must be None (dropless) or a finite float > 0, "
                f"got {self.capacity_factor!r}"
            )

    @property
    def shared_size(self) -> int:
        """Width S of the fused shared-expert MLP (0 when there is none)."""
        if self.num_shared_experts == 0:
            return 0
        return self.num_shared_experts * (self.shared_ffn_size or self.ffn_size)

    def weight_gradient_mode(self, expert_parallel: bool = False) -> str:
        """The FP8 weight-gradient mode a call runs (:func:`weight_gradient_mode` of
        ``fp8_weight_gradients``)."""
        return weight_gradient_mode(self.fp8_weight_gradients, expert_parallel)

    def capacity(self, num_tokens: int) -> int | None:
        """Assignments each expert keeps for ``num_tokens`` tokens (None when dropless)."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * num_tokens * self.top_k / self.num_experts)

    def routed_flops(self, num_tokens: int) -> int:
        """Forward FLOPs of the routed experts: 6 * T * k * H * F."""
        return 6 * num_tokens * self.top_k * self.hidden_size * self.ffn_size


def weight_gradient_mode(fp8_weight_gradients: str | None, expert_parallel: bool = False) -> str:
    """The FP8 weight-gradient mode a call runs for ``MoEConfig.fp8_weight_gradients``: the value
    itself, or for ``None`` ``"unquantized"`` (faster on every measured shape) and ``"fp8"``
    under expert parallelism (the only mode there)."""
    if fp8_weight_gradients is not None:
        return fp8_weight_gradients
    return "fp8" if expert_parallel else "unquantized"
