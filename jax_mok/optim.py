"""Optimizer helpers: which parameters weight decay may touch.

``router_bias`` (sigmoid routing's selection bias) is moved by
:func:`jax_mok.balancing.router_bias_update`, not by gradients: its gradient is zero by design,
so decoupled weight decay (AdamW) would be the only force on it and would pull it to zero
every step, undoing the balancing. :func:`weight_decay_mask` keeps it out, for
:class:`jax_mok.MoEParams` and for Flax NNX / Linen parameter trees alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax

try:  # Flax is optional: without it no NNX tree can exist
    from flax import nnx as _flax_nnx

    from jax_mok.nnx import RouterBias as _RouterBias
except ImportError:
    _flax_nnx, _RouterBias = None, None

ROUTER_BIAS = "router_bias"  # MoEParams field, nnx attribute and linen collection name


def _names(path) -> list[str]:
    names = []
    for entry in path:
        for attr in ("name", "key"):
            value = getattr(entry, attr, None)
            if isinstance(value, str):
                names.append(value)
                break
    return names


def _nnx_types() -> tuple[type | None, type | None]:
    """``(nnx.Variable, jax_mok.nnx.RouterBias)`` when Flax is installed, else Nones (no NNX
    trees can exist then)."""
    if _flax_nnx is None:
        return None, None
    return _flax_nnx.Variable, _RouterBias


def weight_decay_mask(params: Any, *, exclude: Iterable[str] = (),
                      exclude_vectors: bool = False) -> Any:
    """A pytree of bools shaped like ``params``: True where weight decay applies.

    Use it as optax's mask: ``optax.adamw(lr, weight_decay=0.1, mask=weight_decay_mask)``
    (or ``functools.partial(weight_decay_mask, exclude_vectors=True)``); with NNX,
    ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` passes the state it optimizes.

    Args:
      params: a :class:`jax_mok.MoEParams`, a Linen ``params`` dict (or whole ``variables``), an
        ``nnx.State``, or any pytree containing them.
      exclude: more names to leave undecayed: a leaf whose path (dict keys and attribute names)
        contains one of them is excluded, e.g. ``("scale", "bias", "embedding")``.
      exclude_vectors: also exclude every leaf with fewer than 2 dims (norm scales, biases; the
        layers stacked by ``nnx.scan`` / ``nn.scan`` have one dim more: name those instead).

    Returns:
      Bools in the structure of ``params`` (an NNX ``Variable`` counts as one leaf). Always
      False for ``router_bias`` (by name, by the ``router_bias`` collection, or by the NNX type
      :class:`jax_mok.nnx.RouterBias`).

    Example:
      >>> import jax, jax_mok
      >>> cfg = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=8, ffn_size=8,
      ...                         routing="sigmoid")
      >>> mask = weight_decay_mask(jax_mok.init_params(jax.random.key(0), cfg))
      >>> mask.router_bias, mask.w_gate_up
      (False, True)
    """
    if isinstance(exclude, str):
        raise TypeError(f"exclude must be a collection of names, got the string {exclude!r}")
    excluded = {ROUTER_BIAS, *exclude}
    variable_type, bias_type = _nnx_types()

    def is_variable(leaf) -> bool:
        return variable_type is not None and isinstance(leaf, variable_type)

    def decide(path, leaf) -> bool:
        if bias_type is not None and isinstance(leaf, bias_type):
            return False
        if excluded.intersection(_names(path)):
            return False
        value = leaf.get_value() if is_variable(leaf) else leaf
        return not (exclude_vectors and getattr(value, "ndim", 0) < 2)

    return jax.tree_util.tree_map_with_path(decide, params, is_leaf=is_variable)


__all__ = ["weight_decay_mask"]
