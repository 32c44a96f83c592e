"""The transports of expert parallelism: how packed rows reach the devices that own their
experts and how the results come home. :mod:`jax_mok.ep.layer` calls one method,
``transport.experts(packed, w_gate_up, w_down) -> y [T_loc, H] float32`` (the routed experts of
every token of this device, summed per token in destination order), and does not otherwise
depend on which transport it holds.

- :class:`XlaTransport`: ``lax.all_to_all`` there and back, this device's kernels in between,
  the fixed-order home sum (:func:`jax_mok.ep.pack.home_sum`). Any backend. With an FP8 recipe
  the rows to the experts (x forward, dy backward) travel quantized
  (:mod:`jax_mok.quantization.rows`); results come home in x's dtype and add up in float32.
- :class:`jax_mok.ep.peer.PeerTransport`: NVLink peer memory (docs/peer-transport.md).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import jax

from jax_mok.ep.pack import Packed, home_sum
from jax_mok.kernels import autodiff
from jax_mok.quantization import cuda as fp8
from jax_mok.quantization import rows as quantized
from jax_mok.tuning import Tuning


class Transport(Protocol):
    """What :mod:`jax_mok.ep.layer` needs of a transport."""

    def experts(self, packed: Packed, w_gate_up: jax.Array, w_down: jax.Array) -> jax.Array:
        """``y [T_loc, H]`` float32 from this device's packed rows; ``w_gate_up [E_loc, H, 2F]``,
        ``w_down [E_loc, F, H]``: this device's experts in x's dtype."""
        ...


def experts_on_rows(recv_x: jax.Array, recv_ids: jax.Array, recv_w: jax.Array,
                    w_gate_up: jax.Array, w_down: jax.Array, implementation: str,
                    save_activations: bool | None, tuning: Tuning,
                    quantization: str | None = None, weight_grads: str = "fp8") -> jax.Array:
    """This device's experts on the rows it received, ``[EP, R, H]`` (ids, weights
    ``[EP, R, k]``; local expert ids, -1 skipped) → ``[EP, R, H]``: each row's local experts
    summed; padding rows (every id -1) give zeros. With ``quantization`` the FP8 layer
    (:mod:`jax_mok.quantization.cuda`, ``weight_grads`` its weight-gradient mode; its token
    blocks follow the received rows' order), in ``recv_x``'s dtype: float32 for rows that
    travelled quantized."""
    ep, rows, H = recv_x.shape
    args = (recv_x.reshape(ep * rows, H), recv_ids.reshape(ep * rows, -1),
            recv_w.reshape(ep * rows, -1), w_gate_up, w_down)
    if quantization is not None:
        out = fp8.routed_experts_fp8(*args, quantization, implementation=implementation,
                                     save_activations=save_activations, weight_grads=weight_grads)
    else:
        out = autodiff.routed_experts(*args, implementation=implementation,
                                      save_activations=save_activations, tuning=tuning)
    return out.reshape(ep, rows, H)


@dataclasses.dataclass(frozen=True)
class XlaTransport:
    """``lax.all_to_all`` over ``axis`` (inside the layer's ``shard_map``).

    Attributes:
      axis: the expert axis.
      implementation, save_activations: of the local kernels (:func:`autodiff.routed_experts`).
      tuning: the call's resolved :class:`jax_mok.Tuning`.
      quantization: the FP8 recipe of the experts, or None (MoEConfig.quantization).
      weight_grads: the FP8 layer's weight-gradient mode ("fp8": the rows travel quantized, see
        MoEConfig.weight_gradient_mode).
    """

    axis: str
    implementation: str
    save_activations: bool | None
    tuning: Tuning
    quantization: str | None = None
    weight_grads: str = "fp8"

    def experts(self, packed: Packed, w_gate_up: jax.Array, w_down: jax.Array) -> jax.Array:
        recipe = self.quantization
        if recipe is None:
            recv_x = jax.lax.all_to_all(packed.x, self.axis, 0, 0, tiled=True)  # [EP, R, H]
        else:  # FP8 values and scales travel; the FP8 layer runs on float32 deq(Q(x)) rows
            recv_x = quantized.dispatch_rows(packed.x, self.axis, recipe)
        routing = [jax.lax.all_to_all(a, self.axis, 0, 0, tiled=True)  # [EP, R, k]
                   for a in (packed.ids, packed.weights)]
        out = experts_on_rows(recv_x, *routing, w_gate_up, w_down, self.implementation,
                              self.save_activations, self.tuning, recipe, self.weight_grads)
        if recipe is None:
            back = jax.lax.all_to_all(out, self.axis, 0, 0, tiled=True)
        else:  # out float32 -> home in x's dtype; its cotangent dy travels quantized
            back = quantized.return_rows(out, self.axis, recipe, packed.x.dtype)
        return home_sum(back, packed.row, packed.sent, packed.token_of_row, packed.padding)


__all__ = ["Transport", "XlaTransport", "experts_on_rows"]
