"""Hugging Face checkpoints: one MoE block of a transformers model to and from MoEParams.

Model types and what their block computes in transformers (5.x), mapped onto
:class:`jax_mok.MoEConfig`:

- ``qwen3_moe`` (Qwen3MoeSparseMoeBlock): softmax over the router logits, top-k of the
  probabilities, renormalised when ``norm_topk_prob``.
- ``qwen2_moe`` (Qwen2MoeSparseMoeBlock): the same routing, plus one shared SwiGLU expert of width
  ``shared_expert_intermediate_size`` scaled per token by ``sigmoid(x @ shared_expert_gate)``.
- ``mixtral`` (MixtralSparseMoeBlock): softmax, top-k, always renormalised.
- ``deepseek_v3`` (DeepseekV3MoE): sigmoid scores; experts selected by ``scores +
  e_score_correction_bias`` within the ``topk_group`` best of ``n_group`` groups (a group scores
  the sum of its two best biased scores); weights = unbiased scores, renormalised when
  ``norm_topk_prob``, times ``routed_scaling_factor``; ``n_shared_experts`` shared experts
  (one SwiGLU of width ``n_shared_experts * moe_intermediate_size``).

Differences that remain: transformers rounds the routing weights to the model dtype and adds
``1e-20`` to DeepSeek's normaliser; jax_mok keeps float32 weights (identical in float32, within
bf16 rounding otherwise). Top-k ties go to the lower expert index here.

Layouts (names relative to the block's ``prefix``): ``"hub"``, as the checkpoints on the Hub store
them (``experts.{e}.gate_proj/up_proj/down_proj.weight``, Mixtral ``experts.{e}.w1/w3/w2.weight``,
``[F, H]`` / ``[F, H]`` / ``[H, F]``), and ``"fused"``, the transformers-5 module parameters
(``experts.gate_up_proj [E, 2F, H]``, gate rows first, and ``experts.down_proj [E, H, F]``).
Both share ``gate.weight [E, H]`` (the router), DeepSeek's ``gate.e_score_correction_bias [E]``,
the shared expert (``shared_expert.*`` / ``shared_experts.*``, ``*.weight [S, H]`` / ``[H, S]``)
and Qwen2-MoE's ``shared_expert_gate.weight [1, H]``. FP8 block-quantised weights
(``float8_e4m3fn`` with ``*weight_scale_inv`` / ``*_scale_inv`` per
``quantization_config.weight_block_size`` block, 128 x 128 by default) are dequantised on load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jax_mok.config import MoEConfig
from jax_mok.params import MoEParams

MODEL_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v3")
LAYOUTS = ("hub", "fused")
_MISSING = object()
# Expert projection names on the Hub: (gate, up, down).
_HUB_NAMES = {"mixtral": ("w1", "w3", "w2")}
_DEFAULT_HUB_NAMES = ("gate_proj", "up_proj", "down_proj")
_SHARED_PREFIX = {"qwen2_moe": "shared_expert.", "deepseek_v3": "shared_experts."}
_FP8_DTYPES = {np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)}


def _field(hf_config, *names, default=_MISSING):
    """The first of ``names`` set in ``hf_config`` (a transformers config or a plain dict)."""
    for name in names:
        if isinstance(hf_config, Mapping):
            if name in hf_config:
                return hf_config[name]
        elif hasattr(hf_config, name):
            return getattr(hf_config, name)
    if default is _MISSING:
        raise ValueError(f"hf_config has no field {names[0]!r}"
                         + (f" (nor {', '.join(map(repr, names[1:]))})" if names[1:] else ""))
    return default


def model_type(hf_config) -> str:
    """``hf_config``'s ``model_type``, checked against :data:`MODEL_TYPES`."""
    kind = _field(hf_config, "model_type")
    if kind not in MODEL_TYPES:
        raise ValueError(f"hf_config.model_type must be one of {MODEL_TYPES}, got {kind!r}")
    return kind


def _require(hf_config, name: str, allowed, why: str) -> None:
    value = _field(hf_config, name, default=None)
    if value is not None and value not in allowed:
        raise ValueError(f"hf_config.{name}={value!r} cannot be represented by jax_mok: {why}")


def config_from_hf(hf_config) -> MoEConfig:
    """The :class:`jax_mok.MoEConfig` of one MoE block of ``hf_config``'s model.

    Raises ValueError naming the field when the model's block computes something jax_mok
    cannot (another activation, router noise, another scoring or top-k method).
    """
    kind = model_type(hf_config)
    _require(hf_config, "hidden_act", ("silu",), "the experts are SwiGLU with SiLU")
    common = dict(
        top_k=int(_field(hf_config, "num_experts_per_tok")),
        hidden_size=int(_field(hf_config, "hidden_size")),
    )
    if kind == "mixtral":
        noise = float(_field(hf_config, "router_jitter_noise", default=0.0) or 0.0)
        if noise:
            raise ValueError(
                f"hf_config.router_jitter_noise={noise!r} cannot be represented by jax_mok: "
                "Mixtral multiplies training inputs by random noise, jax_mok has no such noise; "
                "set it to 0.0")
        fields = dict(num_experts=int(_field(hf_config, "num_local_experts", "num_experts")),
                      ffn_size=int(_field(hf_config, "intermediate_size")),
                      norm_topk_prob=True)
    elif kind in ("qwen3_moe", "qwen2_moe"):
        fields = dict(num_experts=int(_field(hf_config, "num_experts", "num_local_experts")),
                      ffn_size=int(_field(hf_config, "moe_intermediate_size")),
                      norm_topk_prob=bool(_field(hf_config, "norm_topk_prob", default=False)))
        if kind == "qwen2_moe":
            shared = int(_field(hf_config, "shared_expert_intermediate_size"))
            if shared < 1:
                raise ValueError("hf_config.shared_expert_intermediate_size must be >= 1 (the "
                                 f"block always has a gated shared expert), got {shared}")
            fields.update(num_shared_experts=1, shared_ffn_size=shared, shared_expert_gate=True)
    else:  # deepseek_v3
        _require(hf_config, "scoring_func", ("sigmoid",), "DeepSeek-V3 routing is sigmoid")
        _require(hf_config, "topk_method", ("noaux_tc",),
                 "jax_mok's group-limited top-k is DeepSeek-V3's noaux_tc (groups scored by "
                 "their two best biased scores)")
        n_group = _field(hf_config, "n_group", default=None)
        topk_group = _field(hf_config, "topk_group", default=None) if n_group else None
        shared = int(_field(hf_config, "n_shared_experts", default=0) or 0)
        ffn = int(_field(hf_config, "moe_intermediate_size"))
        fields = dict(
            num_experts=int(_field(hf_config, "n_routed_experts", "num_local_experts")),
            ffn_size=ffn, routing="sigmoid",
            norm_topk_prob=bool(_field(hf_config, "norm_topk_prob", default=True)),
            routed_scaling_factor=float(_field(hf_config, "routed_scaling_factor",
                                               default=1.0)),
            n_group=int(n_group) if n_group else None,
            topk_group=int(topk_group) if topk_group else None,
            num_shared_experts=shared, shared_ffn_size=ffn if shared else None)
    try:
        return MoEConfig(**common, **fields)
    except ValueError as err:
        raise ValueError(f"hf_config ({kind}) gives an invalid MoEConfig: {err}") from err


def _fp8_block(hf_config) -> tuple[int, int]:
    quant = _field(hf_config, "quantization_config", default=None)
    block = None
    if isinstance(quant, Mapping):
        block = quant.get("weight_block_size")
    elif quant is not None:
        block = getattr(quant, "weight_block_size", None)
    return tuple(int(b) for b in block) if block else (128, 128)


def _to_numpy(value) -> np.ndarray:
    """NumPy view of a NumPy, JAX or torch array (torch imported only for torch tensors)."""
    if type(value).__module__.split(".")[0] == "torch":
        import torch

        tensor = value.detach().cpu()
        name = str(tensor.dtype).removeprefix("torch.")
        if hasattr(ml_dtypes, name):  # bfloat16 / float8_*: NumPy has no such dtype
            ints = {1: torch.uint8, 2: torch.int16}[tensor.element_size()]
            return tensor.contiguous().view(ints).numpy().view(getattr(ml_dtypes, name))
        return tensor.numpy()
    return np.asarray(value)


class _Reader:
    """Reads the block's tensors from ``state_dict`` under ``prefix``, dequantising FP8, and
    remembers which keys were read so that unread ones can be reported."""

    def __init__(self, state_dict: Mapping, prefix: str, hf_config):
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping of names to arrays, got "
                            f"{type(state_dict).__name__}")
        self.state_dict, self.prefix = state_dict, prefix
        self.block = _fp8_block(hf_config)
        self.used: set[str] = set()
        self.dequantized = False  # an FP8 tensor was read

    def has(self, name: str) -> bool:
        return self.prefix + name in self.state_dict

    def get(self, name: str, shape: tuple) -> np.ndarray:
        key = self.prefix + name
        if key not in self.state_dict:
            raise KeyError(f"state_dict has no {key!r} (expected shape {shape})")
        self.used.add(key)
        value = _to_numpy(self.state_dict[key])
        if tuple(value.shape) != tuple(shape):
            raise ValueError(f"state_dict[{key!r}] must have shape {tuple(shape)}, got "
                             f"{tuple(value.shape)}")
        scale_key = key[: -len("weight")] + "weight_scale_inv" if key.endswith(
            ".weight") else key + "_scale_inv"
        if scale_key in self.state_dict:
            self.used.add(scale_key)
            self.dequantized = True
            return self._dequantize(value, _to_numpy(self.state_dict[scale_key]), scale_key)
        if value.dtype in _FP8_DTYPES:
            raise ValueError(f"state_dict[{key!r}] is {value.dtype} but has no {scale_key!r}")
        return value

    def _dequantize(self, value, scale, scale_key) -> np.ndarray:
        """``value * scale_inv`` per ``block`` over the last two dims, in float32."""
        rows, cols = value.shape[-2:]
        br, bc = self.block
        want = value.shape[:-2] + (-(-rows // br), -(-cols // bc))
        if tuple(scale.shape) != want:
            raise ValueError(f"state_dict[{scale_key!r}] must have shape {want} for "
                             f"{br}x{bc} blocks, got {tuple(scale.shape)}")
        full = np.repeat(np.repeat(scale.astype(np.float32), br, -2), bc, -1)
        return value.astype(np.float32) * full[..., :rows, :cols]

    def unread(self) -> list[str]:
        return sorted(k for k in self.state_dict
                      if k.startswith(self.prefix) and k not in self.used)


def _normalize_prefix(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    return prefix if not prefix or prefix.endswith(".") else prefix + "."


def from_hf(state_dict: Mapping[str, Any], hf_config, *, prefix: str = "",
            dtype=None) -> MoEParams:
    """MoEParams of one transformers MoE block (Hub or transformers-5 layout, detected).

    Args:
      state_dict: names to arrays (NumPy, JAX or torch tensors); a whole model's dict works,
        only names under ``prefix`` are read, and every one of them must be used.
      hf_config: the model's transformers config, or a dict with its field names.
      prefix: the block's name prefix, e.g. ``"model.layers.3.mlp."`` (Mixtral on the Hub:
        ``"model.layers.3.block_sparse_moe."``).
      dtype: dtype of the expert and shared-expert weights; ``None`` keeps the checkpoint's
        (bfloat16 for FP8 weights, which are dequantised). The router, router_bias and
        shared_gate are float32 whatever the checkpoint holds.

    Returns:
      :class:`jax_mok.MoEParams` with ``config = config_from_hf(hf_config)``:
      ``router [H, E]``, ``w_gate_up [E, H, 2F]``, ``w_down [E, F, H]`` and the rest as the
      config asks.
    """
    config = config_from_hf(hf_config)
    kind = model_type(hf_config)
    reader = _Reader(state_dict, _normalize_prefix(prefix), hf_config)
    E, H, F, S = config.num_experts, config.hidden_size, config.ffn_size, config.shared_size
    gate_n, up_n, down_n = _HUB_NAMES.get(kind, _DEFAULT_HUB_NAMES)
    if reader.has("experts.gate_up_proj"):
        gate_up = reader.get("experts.gate_up_proj", (E, 2 * F, H))
        down = reader.get("experts.down_proj", (E, H, F))
    elif reader.has(f"experts.0.{gate_n}.weight"):
        def stack(name, shape):
            return np.stack([reader.get(f"experts.{e}.{name}.weight", shape) for e in range(E)])

        gate_up = np.concatenate([stack(gate_n, (F, H)), stack(up_n, (F, H))], axis=1)
        down = stack(down_n, (H, F))
    else:
        raise KeyError(
            f"state_dict has neither {reader.prefix}experts.gate_up_proj (fused layout) nor "
            f"{reader.prefix}experts.0.{gate_n}.weight (Hub layout); check prefix "
            f"(names under it: {reader.unread()[:6]})")
    expert_dtype = dtype
    if expert_dtype is None:
        expert_dtype = (jnp.bfloat16 if reader.dequantized
                        else jnp.result_type(gate_up.dtype, down.dtype))

    def expert_array(a):
        return jnp.asarray(a, expert_dtype)

    fields = dict(
        router=jnp.asarray(reader.get("gate.weight", (E, H)).T, jnp.float32),
        router_bias=None,
        w_gate_up=expert_array(gate_up.transpose(0, 2, 1)),
        w_down=expert_array(down.transpose(0, 2, 1)),
        shared_gate_up=None, shared_down=None, shared_gate=None)
    if config.routing == "sigmoid":
        fields["router_bias"] = jnp.asarray(reader.get("gate.e_score_correction_bias", (E,)),
                                            jnp.float32)
    if S:
        sp = _SHARED_PREFIX[kind]
        g = reader.get(sp + "gate_proj.weight", (S, H))
        u = reader.get(sp + "up_proj.weight", (S, H))
        fields["shared_gate_up"] = expert_array(np.concatenate([g, u], axis=0).T)
        fields["shared_down"] = expert_array(reader.get(sp + "down_proj.weight", (H, S)).T)
    if config.shared_expert_gate:
        fields["shared_gate"] = jnp.asarray(reader.get("shared_expert_gate.weight", (1, H)).T,
                                            jnp.float32)
    unread = reader.unread()
    if unread:
        raise ValueError(f"state_dict has names under prefix {reader.prefix!r} that a {kind} "
                         f"MoE block does not have: {unread[:8]}"
                         + (f" and {len(unread) - 8} more" if len(unread) > 8 else ""))
    return MoEParams(config=config, **fields)


_HF_FIELDS = ("num_experts", "top_k", "hidden_size", "ffn_size", "routing", "norm_topk_prob",
              "routed_scaling_factor", "n_group", "topk_group", "num_shared_experts",
              "shared_size", "shared_expert_gate")


def to_hf(params: MoEParams, hf_config, *, layout: str = "hub", prefix: str = "",
          dtype=None) -> dict[str, np.ndarray]:
    """The transformers names and NumPy arrays of ``params`` (inverse of :func:`from_hf`).

    Args:
      params: weights whose config matches ``config_from_hf(hf_config)`` (checked field by field;
        capacity, precision and activation-saving settings are jax_mok's own and not compared).
      hf_config: the model's transformers config, or a dict with its field names.
      layout: ``"hub"`` (per-expert tensors, as Hub checkpoints) or ``"fused"`` (transformers-5
        ``experts.gate_up_proj [E, 2F, H]`` / ``experts.down_proj [E, H, F]``).
      prefix: prepended to every name.
      dtype: dtype of every weight (``None``: each keeps its dtype in params, the router
        float32); DeepSeek's ``e_score_correction_bias`` stays float32 as transformers keeps it.
        Weights are written unquantised (no FP8).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not isinstance(params, MoEParams):
        raise TypeError(f"params must be a jax_mok.MoEParams, got {type(params).__name__}")
    kind = model_type(hf_config)
    want = config_from_hf(hf_config)
    for name in _HF_FIELDS:
        got, expected = getattr(params.config, name), getattr(want, name)
        if got != expected:
            raise ValueError(f"params.config.{name}={got!r} but hf_config gives {expected!r}")
    prefix = _normalize_prefix(prefix)
    E, F, S = want.num_experts, want.ffn_size, want.shared_size

    def host(a):
        a = np.asarray(a)
        return a if dtype is None else a.astype(jnp.dtype(dtype))

    out = {"gate.weight": host(params.router).T}
    if kind == "deepseek_v3":  # no bias in params is a zero bias
        bias = params.router_bias if params.router_bias is not None else np.zeros(E)
        out["gate.e_score_correction_bias"] = np.asarray(bias, np.float32)
    w_gate_up = host(params.w_gate_up).transpose(0, 2, 1)  # [E, 2F, H]
    w_down = host(params.w_down).transpose(0, 2, 1)  # [E, H, F]
    if layout == "fused":
        out["experts.gate_up_proj"], out["experts.down_proj"] = w_gate_up, w_down
    else:
        gate_n, up_n, down_n = _HUB_NAMES.get(kind, _DEFAULT_HUB_NAMES)
        for e in range(E):
            out[f"experts.{e}.{gate_n}.weight"] = w_gate_up[e, :F]
            out[f"experts.{e}.{up_n}.weight"] = w_gate_up[e, F:]
            out[f"experts.{e}.{down_n}.weight"] = w_down[e]
    if S:
        sp = _SHARED_PREFIX[kind]
        shared_gate_up = host(params.shared_gate_up).T  # [2S, H]
        out[sp + "gate_proj.weight"] = shared_gate_up[:S]
        out[sp + "up_proj.weight"] = shared_gate_up[S:]
        out[sp + "down_proj.weight"] = host(params.shared_down).T
    if want.shared_expert_gate:
        out["shared_expert_gate.weight"] = host(params.shared_gate).T
    return {prefix + name: np.ascontiguousarray(value) for name, value in out.items()}


__all__ = ["LAYOUTS", "MODEL_TYPES", "config_from_hf", "from_hf", "model_type", "to_hf"]
