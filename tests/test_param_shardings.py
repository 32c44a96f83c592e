"""jax_mok.sharding.param_shardings and the logical-axis presets (no devices needed beyond one:
the shardings are built on abstract meshes)."""

from __future__ import annotations

import dataclasses

import jax
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mok
from jax_mok import sharding

CONFIG = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=16, ffn_size=8)


def _mesh(**axes):
    try:  # jax >= 0.7: AbstractMesh(axis_sizes, axis_names)
        return AbstractMesh(tuple(axes.values()), tuple(axes))
    except TypeError:
        return AbstractMesh(tuple(axes.items()))


def _specs(tree):
    return {name: (None if s is None else tuple(s.spec))
            for name, s in vars(tree).items() if name != "config"}


@pytest.mark.parametrize("kind", ["config", "params"])
def test_experts_over_the_axis_everything_else_replicated(kind):
    config = dataclasses.replace(CONFIG, routing="sigmoid", num_shared_experts=1,
                                 shared_expert_gate=True)
    arg = config if kind == "config" else jax_mok.init_params(jax.random.key(0), config)
    got = sharding.param_shardings(arg, _mesh(data=2, expert=4))
    assert isinstance(got, jax_mok.MoEParams) and got.config == config
    assert _specs(got) == {
        "router": (), "router_bias": (), "w_gate_up": ("expert", None, None),
        "w_down": ("expert", None, None), "shared_gate_up": (), "shared_down": (),
        "shared_gate": (),
    }
    assert all(isinstance(s, NamedSharding) for s in jax.tree.leaves(got))


def test_structure_follows_the_layer():
    """Absent weights stay None, so the tree matches the params for jax.device_put."""
    params = jax_mok.init_params(jax.random.key(0), CONFIG)
    got = sharding.param_shardings(params, _mesh(expert=2))
    assert got.router_bias is None and got.shared_gate_up is None and got.shared_gate is None
    assert jax.tree.structure(got) == jax.tree.structure(params)
    placed = jax.device_put(params, sharding.param_shardings(params, jax.make_mesh(
        (1,), ("expert",), devices=jax.devices()[:1])))
    assert tuple(placed.w_down.sharding.spec) == ("expert", None, None)


def test_replicated_experts_and_errors():
    got = sharding.param_shardings(CONFIG, _mesh(data=4), expert_axis=None)
    assert _specs(got)["w_gate_up"] == (None, None, None)
    with pytest.raises(ValueError, match=r"expert_axis='expert' is not an axis .* \('data',\)"):
        sharding.param_shardings(CONFIG, _mesh(data=4))
    with pytest.raises(ValueError, match=r"num_experts=8 must be divisible .* 'expert' \(3\)"):
        sharding.param_shardings(CONFIG, _mesh(expert=3))
    with pytest.raises(TypeError, match="MoEParams or MoEConfig"):
        sharding.param_shardings({"router": 1}, _mesh(expert=2))


def test_presets_name_the_module_dims_and_map_them_to_the_expert_axis():
    assert sharding.logical_names() == {"expert_axis": "expert", "embed_axis": "embed",
                                        "mlp_axis": "mlp"}
    assert sharding.logical_names("maxtext")["expert_axis"] == "exp"
    assert sharding.logical_axis_rules("maxtext") == (("exp", "expert"), ("embed", None),
                                                      ("mlp", None))
    assert sharding.logical_axis_rules(expert_axis=None)[0] == ("expert", None)
    with pytest.raises(ValueError, match=r"preset must be one of \['flax', 'maxtext'\]"):
        sharding.logical_names("t5x")


def test_maxtext_names_on_the_nnx_module_map_to_the_expert_sharding():
    nnx = pytest.importorskip("flax.nnx")
    linen = pytest.importorskip("flax.linen")
    import jax_mok.nnx  # needs Flax
    model = jax_mok.nnx.MoE(CONFIG, rngs=nnx.Rngs(0), **sharding.logical_names("maxtext"))
    specs = nnx.get_partition_spec(nnx.state(model))
    rules = sharding.logical_axis_rules("maxtext")
    for name in ("w_gate_up", "w_down"):
        logical = specs[name].get_value()
        assert linen.logical_to_mesh_axes(logical, rules) == P("expert", None, None)
    assert linen.logical_to_mesh_axes(specs["router"].get_value(), rules) == P(None, None)
