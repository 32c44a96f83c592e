"""Varying-manual-axes (vma) types for the FFI calls and the custom VJPs.

Inside a ``shard_map`` that checks them (``check_vma=True``, the default), every value's type
says over which manual axes it varies. An FFI call's result types come from its declared shapes,
which say "invariant"; :func:`varying_like` gives them the axes their operands vary over (the
kernels compute per device). A custom VJP's backward must return each cotangent with its
primal's type: :func:`cotangent_like` sums a cotangent over the axes the primal was invariant
over (the transpose of the implicit broadcast), and marks it varying where the primal was.
Outside ``shard_map`` (no manual axes) both are the identity.
"""

from __future__ import annotations

import jax


def axes(*arrays) -> frozenset:
    """The union of the manual axes ``arrays`` vary over (empty where JAX has no vma types)."""
    out = frozenset()
    for a in jax.tree.leaves(arrays):
        aval = jax.typeof(a)
        manual = getattr(aval, "manual_axis_type", None)  # jax >= 0.10
        if manual is not None:
            out |= frozenset(getattr(manual, "varying", None) or ())
        else:  # jax 0.7 - 0.9
            out |= frozenset(getattr(aval, "vma", None) or ())
    return out


def _to_varying(a, names: tuple[str, ...]):
    pcast = getattr(jax.lax, "pcast", None)
    if pcast is not None:
        return pcast(a, names, to="varying")
    return jax.lax.pvary(a, names)  # jax < 0.8


def varying_like(results, *operands):
    """``results`` (a pytree) typed as varying over every axis one of ``operands`` varies over."""
    want = axes(*operands)
    if not want:
        return results

    def one(a):
        missing = tuple(sorted(want - axes(a)))
        return _to_varying(a, missing) if missing else a

    return jax.tree.map(one, results)


def cotangent_like(ct, primal):
    """``ct`` with the vma type of ``primal``: summed over the axes only ``ct`` varies over,
    marked varying over the axes only ``primal`` varies over. None stays None."""
    if ct is None:
        return None
    want, have = axes(primal), axes(ct)
    extra = tuple(sorted(have - want))
    if extra:
        ct = jax.lax.psum(ct, extra)
    missing = tuple(sorted(want - have))
    return _to_varying(ct, missing) if missing else ct


__all__ = ["axes", "cotangent_like", "varying_like"]
