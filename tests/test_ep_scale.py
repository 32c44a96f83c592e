"""Expert parallelism at EP = 2, 4 and 8 on CPU devices, transport "peer" with its exchange
emulated by host callbacks (tests/test_peer_transport.py's ``_HostExchange``: the JAX glue of the
peer transport — packing, home rows, transposes — not the CUDA kernels).

At EP = 8 dropless and with a capacity short enough that the chunks hold fewer rows than a rank
has tokens (``R = E_loc * C < T_loc``), at EP = 2 dropless, at EP = 4 with that capacity:
values, aux and every gradient against transport "xla" (1e-6 relative: the same float32
arithmetic; bitwise equal at EP = 2 and 4, ~2e-7 on the gradients at EP = 8, where the
emulator's ``sum`` over destinations is XLA's reduction rather than the kernels' ascending adds)
and against the single-device layer (``testing.tolerance``,
1e-4 in float32; seen: <= 2.4e-7, a token's expert outputs being summed per destination before
the sum over destinations), and bitwise equality of two calls. Then tools/ep_traffic_model.py's
rows and bytes against a direct count from ``jax_mok.ep.pack.dispatch_indices`` and
``WorkspaceSpec``.

Needs 8 CPU devices, asked for at import as tests/test_sharding.py does.
"""

from __future__ import annotations

import os
import sys

import cpu_devices
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mok
from jax_mok import testing
from jax_mok.ep import pack, peer, workspace

CPU_DEVICES = cpu_devices.CPU_DEVICES
cpu_devices.request()

from test_peer_transport import _HostExchange, _value_and_grad  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import ep_traffic_model  # noqa: E402

TOKENS = 64  # global: T_loc = 64 / EP tokens per rank
# 16 experts, top-4: at EP = 8 a rank holds 2 experts, so some tokens send one row for two slots.
CONFIG = {"num_experts": 16, "top_k": 4, "hidden_size": 64, "ffn_size": 32,
          "num_shared_experts": 1}
# C = ceil(0.15 * 64 * 4 / 16) = 3 per expert; R = E_loc * C = 24, 12, 6 < T_loc = 32, 16, 8.
CAPACITY = 0.15
XLA_TOLERANCE = 1e-6


def _mesh(ep: int):
    return jax.sharding.Mesh(np.array(cpu_devices.devices(ep)), ("expert",))


def _fake_peer(monkeypatch, mesh) -> _HostExchange:
    emulator = _HostExchange(mesh, "expert")
    monkeypatch.setattr(peer, "_backend", emulator)
    cpu_devices.fake_peer(monkeypatch)
    return emulator


def _assert_close(got, want, tol, what):
    (_, (y1, aux1)), g1 = got
    (_, (y0, aux0)), g0 = want
    assert testing.rel_error(y1, y0) < tol, f"{what}: y"
    np.testing.assert_array_equal(aux1["expert_counts"], aux0["expert_counts"], err_msg=what)
    assert int(aux1["dropped_tokens"]) == int(aux0["dropped_tokens"]), what
    for (path, ref), value in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g1),
                                  strict=True):
        err = testing.rel_error(value, ref)
        assert err < tol, f"{what}: gradient {jax.tree_util.keystr(path)} rel error {err}"


def _bits(tree):
    return [np.atleast_1d(np.asarray(a)).view(np.uint8) for a in jax.tree.leaves(tree)]


# EP = 8 both ways (where a rank holds 2 experts and some tokens send one row for two slots);
# EP = 2 and 4 one way each, so that dropless and capacity each run at two sizes. (The full
# 3 x 2 product added EP = 2 with a capacity and EP = 4 dropless: the same program at a size
# already covered, ~20 s of compiles on 2 CPU cores.)
@pytest.mark.parametrize("ep,capacity_factor", [(2, None), (4, CAPACITY), (8, None),
                                                (8, CAPACITY)],
                         ids=["2-dropless", "4-capacity", "8-dropless", "8-capacity"])
def test_peer_glue_at_ep(monkeypatch, ep, capacity_factor):
    mesh = _mesh(ep)
    emulator = _fake_peer(monkeypatch, mesh)
    config = jax_mok.MoEConfig(**CONFIG, capacity_factor=capacity_factor)
    params = testing.random_params(jax.random.key(ep), config)
    x = jax.random.normal(jax.random.key(10 + ep), (TOKENS, config.hidden_size))
    rows = pack.buffer_rows(config, TOKENS // ep, TOKENS, ep)
    if capacity_factor is not None:
        assert rows < TOKENS // ep, "the capacity case must shorten the chunks"

    single = _value_and_grad(x, params)(x, params)
    xla = _value_and_grad(x, params, mesh=mesh, transport="xla")(x, params)
    fn = _value_and_grad(x, params, mesh=mesh, transport="peer")
    first, second = fn(x, params), fn(x, params)

    assert set(emulator.phases) == {peer.DISPATCH, peer.COMBINE, peer.REVERSE_DISPATCH,
                                    peer.REVERSE_COMBINE}
    dropped = int(first[0][1][1]["dropped_tokens"])
    assert (dropped > 0) == (capacity_factor is not None), dropped
    _assert_close(first, xla, XLA_TOLERANCE, f"EP={ep} peer vs xla")
    _assert_close(first, single, testing.tolerance(jnp.float32), f"EP={ep} peer vs one device")
    for a, b in zip(_bits(first), _bits(second), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=f"EP={ep}: two calls differ")


@pytest.mark.parametrize("shape", ["S1", "S2"])
@pytest.mark.parametrize("ep", [2, 4, 8])
def test_traffic_model_counts_the_packed_rows(ep, shape):
    """The model's routed rows per destination (hypergeometric) against the rows
    ``dispatch_indices`` packs for balanced random routing, and its worst-case bytes against the
    chunk the workspace allocates."""
    hidden, k, experts = ep_traffic_model.SHAPES[shape]
    tokens = 8192
    ids, _ = testing.random_routing(jax.random.key(ep), tokens, experts, k)
    _, sent, _, source_token, overflow = pack.dispatch_indices(ids, ep, experts // ep, tokens)
    assert int(overflow) == 0
    counted = np.asarray(sent).sum(0)  # [EP]: rows this rank sends to each destination
    np.testing.assert_array_equal(counted, (np.asarray(source_token) < tokens).sum(1))
    want = tokens * ep_traffic_model.routed_fraction(ep, k, experts)
    # Binomial spread: sd = sqrt(T p (1 - p)) <= 46 rows; 4 sd over the EP destinations' mean.
    assert abs(counted.mean() - want) < 4 * np.sqrt(want * (1 - want / tokens) / ep) + 1, (
        counted, want)

    model = ep_traffic_model.direction_bytes(ep, tokens, hidden, k)
    spec = workspace.WorkspaceSpec(ep, tokens, hidden, k, "bfloat16")
    assert model["dispatch"] == (ep - 1) * spec.dispatch_chunk_bytes
    assert model["combine"] == (ep - 1) * spec.combine_chunk_bytes
    assert ep_traffic_model.workspace_bytes(ep, tokens, hidden, k) == spec.total_bytes
    routed = ep_traffic_model.direction_bytes(ep, tokens, hidden, k, experts, routed=True)
    np.testing.assert_allclose(routed["forward"] / model["forward"], want / tokens)


def test_traffic_model_table_prints():
    text = ep_traffic_model.table()
    assert text.count("\n| 64 |") == 2 and "| 8 | S2 |" in text
    assert "fit: t = " in ep_traffic_model.validation()
