"""Routing semantics against hand computations in NumPy: selection, weights, groups, capacity,
aux losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mok
from jax_mok.routing import DROPPED, aux_losses, route


def _np_route(x, router, bias, cfg):
    logits = x.astype(np.float64) @ router.astype(np.float64)
    if cfg.routing == "softmax":
        e = np.exp(logits - logits.max(-1, keepdims=True))
        scores = e / e.sum(-1, keepdims=True)
        sel = scores.copy()
    else:
        scores = 1 / (1 + np.exp(-logits))
        sel = scores + (bias if bias is not None else 0)
    T, E = sel.shape
    if cfg.n_group:
        per = E // cfg.n_group
        g = np.sort(sel.reshape(T, cfg.n_group, per), -1)[..., ::-1][..., : min(2, per)].sum(-1)
        for t in range(T):
            keep = np.argsort(-g[t], kind="stable")[: cfg.topk_group]
            mask = np.zeros(E, bool)
            for grp in keep:
                mask[grp * per:(grp + 1) * per] = True
            sel[t, ~mask] = -np.inf
    ids = np.argsort(-sel, axis=-1, kind="stable")[:, : cfg.top_k]
    w = np.take_along_axis(scores, ids, -1)
    if cfg.norm_topk_prob:
        w = w / w.sum(-1, keepdims=True)
    return logits, scores, ids, w * cfg.routed_scaling_factor


CONFIGS = {
    "softmax": dict(),
    "softmax_nonorm_scaled": dict(norm_topk_prob=False, routed_scaling_factor=1.7),
    "sigmoid_bias": dict(routing="sigmoid"),
    "sigmoid_groups": dict(routing="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5),
    "softmax_groups_of_one": dict(n_group=8, topk_group=3),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_route_matches_numpy(name):
    cfg = jax_mok.MoEConfig(num_experts=8, top_k=3, hidden_size=12, ffn_size=4, **CONFIGS[name])
    key = jax.random.key(0)
    x = jax.random.normal(key, (50, 12))
    router = jax.random.normal(jax.random.fold_in(key, 1), (12, 8))
    bias = None
    if cfg.routing == "sigmoid":
        bias = 0.3 * jax.random.normal(jax.random.fold_in(key, 2), (8,))
    routing, _ = route(x, router, bias, cfg)
    logits, scores, ids, w = _np_route(np.asarray(x), np.asarray(router),
                                       None if bias is None else np.asarray(bias), cfg)
    np.testing.assert_array_equal(np.asarray(routing.topk_ids), ids)
    np.testing.assert_allclose(np.asarray(routing.topk_weights), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(routing.scores), scores, rtol=1e-5, atol=1e-7)


def test_bias_selects_but_never_weights():
    cfg = jax_mok.MoEConfig(num_experts=4, top_k=1, hidden_size=4, ffn_size=4, routing="sigmoid",
                            norm_topk_prob=False)
    x = jnp.eye(4)
    router = jnp.zeros((4, 4))  # every score is sigmoid(0) = 0.5
    bias = jnp.array([0.0, 0.0, 5.0, 0.0])
    routing, _ = route(x, router, bias, cfg)
    assert (np.asarray(routing.topk_ids) == 2).all()
    np.testing.assert_allclose(np.asarray(routing.topk_weights), 0.5)


def test_ties_go_to_the_lower_index():
    cfg = jax_mok.MoEConfig(num_experts=6, top_k=3, hidden_size=4, ffn_size=4)
    routing, _ = route(jnp.ones((5, 4)), jnp.zeros((4, 6)), None, cfg)
    np.testing.assert_array_equal(np.asarray(routing.topk_ids), [[0, 1, 2]] * 5)


def test_capacity_keeps_earliest_tokens_and_counts_drops():
    E, k, T, c = 4, 2, 40, 0.5
    cfg = jax_mok.MoEConfig(num_experts=E, top_k=k, hidden_size=8, ffn_size=4, capacity_factor=c)
    key = jax.random.key(4)
    x = jax.random.normal(key, (T, 8))
    router = jax.random.normal(jax.random.fold_in(key, 1), (8, E)) * 3
    routing, routed = route(x, router, None, cfg)
    capacity = int(np.ceil(c * T * k / E))
    routed, kept = np.asarray(routed), np.asarray(routing.topk_ids)
    seen = np.zeros(E, int)
    expected = routed.copy()
    for t in range(T):
        for j in range(k):
            e = routed[t, j]
            expected[t, j] = e if seen[e] < capacity else DROPPED
            seen[e] += 1
    np.testing.assert_array_equal(kept, expected)
    assert int(routing.dropped) == int((expected == DROPPED).sum()) > 0
    np.testing.assert_array_equal(np.asarray(routing.expert_counts), np.minimum(seen, capacity))


def test_aux_losses_by_hand():
    cfg = jax_mok.MoEConfig(num_experts=5, top_k=2, hidden_size=6, ffn_size=4)
    key = jax.random.key(5)
    x = jax.random.normal(key, (30, 6))
    router = jax.random.normal(jax.random.fold_in(key, 1), (6, 5))
    routing, routed = route(x, router, None, cfg)
    aux = aux_losses(routing, routed, cfg)
    logits, scores, ids, _ = _np_route(np.asarray(x), np.asarray(router), None, cfg)
    f = np.bincount(ids.ravel(), minlength=5) / ids.size
    P = scores.mean(0)
    np.testing.assert_allclose(float(aux["load_balancing_loss"]), 5 * (f * P).sum(), rtol=1e-5)
    lse = np.log(np.exp(logits).sum(-1))
    np.testing.assert_allclose(float(aux["router_z_loss"]), (lse ** 2).mean(), rtol=1e-5)
    counts = np.bincount(ids.ravel(), minlength=5)
    np.testing.assert_array_equal(np.asarray(aux["expert_counts"]), counts)
    assert int(aux["dropped_tokens"]) == 0


def test_moe_return_aux_and_router_gets_lbl_gradient():
    cfg = jax_mok.MoEConfig(num_experts=4, top_k=2, hidden_size=8, ffn_size=4)
    params = jax_mok.init_params(jax.random.key(0), cfg, dtype=jnp.float32)
    x = jax.random.normal(jax.random.key(1), (2, 9, 8))
    # Jitted: one compile each instead of the routing's and the aux losses' op-by-op dispatch.
    y, aux = jax.jit(lambda x, p: jax_mok.moe(x, p, return_aux=True))(x, params)
    assert y.shape == x.shape
    assert set(aux) == {"load_balancing_loss", "router_z_loss", "expert_counts", "dropped_tokens"}
    assert aux["expert_counts"].dtype == jnp.int32 and int(aux["expert_counts"].sum()) == 36
    g = jax.jit(jax.grad(lambda p: jax_mok.moe(x, p, return_aux=True)[1]["load_balancing_loss"]))(
        params)
    assert np.abs(np.asarray(g.router)).sum() > 0


@pytest.mark.parametrize("setting,name", [("highest", "HIGHEST"), ("high", "HIGH"),
                                          ("default", "DEFAULT")])
def test_router_precision_reaches_the_router_dot(setting, name):
    """MoEConfig.router_precision sets the router GEMM's precision (seen in the jaxpr); a bad
    value is refused naming the field. (CPU computes float32 exactly either way.)"""
    cfg = jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=16, ffn_size=8,
                            router_precision=setting)
    x = jax.random.normal(jax.random.key(0), (4, 16))
    router = jax.random.normal(jax.random.key(1), (16, 8))
    jaxpr = jax.make_jaxpr(lambda a, b: route(a, b, None, cfg)[0].topk_ids)(x, router).jaxpr
    dots = [e.params["precision"] for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    want = getattr(jax.lax.Precision, name)
    assert len(dots) == 1 and all(p in (want, (want, want)) for p in dots), dots
    with pytest.raises(ValueError, match="router_precision"):
        jax_mok.MoEConfig(num_experts=8, top_k=2, hidden_size=16, ffn_size=8,
                          router_precision="bf16")
