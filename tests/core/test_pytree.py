"""Struct classes as JAX pytrees: leaves, key paths, transformations, static and opaque fields."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from jax.tree_util import GetAttrKey


class Params(js.Struct):
    w: object
    b: object
    lr: float = js.field(static=True, default=1e-3)


def _params() -> Params:
    return Params(w=jnp.ones(4), b=jnp.zeros(4))


# -- registration --------------------------------------------------------------------


def test_subclass_is_registered_at_definition() -> None:
    """Every Struct subclass is a registered pytree type as soon as it is defined."""

    class Fresh(js.Struct):
        a: object

    assert js.is_registered_pytree_type(Fresh)
    assert jax.tree_util.tree_leaves(Fresh(1)) == [1]


def test_node_fields_are_leaves_in_order() -> None:
    """tree_leaves lists the node fields in declaration order."""
    p = _params()
    leaves = jax.tree_util.tree_leaves(p)
    assert len(leaves) == 2 and leaves[0] is p.w and leaves[1] is p.b


def test_static_fields_are_not_leaves() -> None:
    """Static fields are aux data, not leaves."""
    assert len(jax.tree_util.tree_leaves(_params())) == 2


def test_static_fields_are_in_the_treedef() -> None:
    """Different static values give different tree structures."""
    a = jax.tree_util.tree_structure(Params(1, 2, lr=0.1))
    b = jax.tree_util.tree_structure(Params(1, 2, lr=0.2))
    assert a != b
    assert a == jax.tree_util.tree_structure(Params(3, 4, lr=0.1))


def test_key_paths_use_getattrkey() -> None:
    """tree_flatten_with_path labels node fields with GetAttrKey(name)."""
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(_params())[0]]
    assert paths == [(GetAttrKey("w"),), (GetAttrKey("b"),)]


def test_nested_key_paths() -> None:
    """Key paths continue into nested containers and structs."""

    class Outer(js.Struct):
        inner: Params
        extra: dict

    outer = Outer(inner=_params(), extra={"k": 1.0})
    paths = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(outer)[0]}
    assert paths == {".inner.w", ".inner.b", ".extra['k']"}


def test_tree_map_returns_same_class_and_statics() -> None:
    """tree_map rebuilds the struct class with static fields kept."""
    out = jax.tree_util.tree_map(jnp.zeros_like, Params(jnp.ones(2), jnp.ones(2), lr=0.5))
    assert type(out) is Params and out.lr == 0.5
    assert jnp.array_equal(out.w, jnp.zeros(2))


def test_node_field_holding_pytree_is_traversed() -> None:
    """A node field holding a dict contributes the dict's leaves."""
    p = Params(w={"a": jnp.ones(1), "b": [jnp.ones(2), 3.0]}, b=None)
    assert len(jax.tree_util.tree_leaves(p)) == 3


# -- transformations -----------------------------------------------------------------


def test_jit_through_struct() -> None:
    """jit traces through node fields and returns a struct."""

    @jax.jit
    def step(p: Params) -> Params:
        return p.replace(w=p.w - p.lr)

    out = step(_params())
    assert type(out) is Params
    assert jnp.allclose(out.w, 1.0 - 1e-3)


def test_grad_returns_struct_of_gradients() -> None:
    """grad differentiates through node fields and returns a struct of gradients."""
    g = jax.grad(lambda p: jnp.sum(p.w**2) + jnp.sum(p.b))(_params())
    assert type(g) is Params
    assert jnp.array_equal(g.w, 2 * jnp.ones(4)) and jnp.array_equal(g.b, jnp.ones(4))


def test_vmap_batches_over_node_fields() -> None:
    """vmap maps over the leading axis of node fields."""
    batch = jax.tree_util.tree_map(lambda x: jnp.stack([x, 2 * x]), _params())
    out = jax.vmap(lambda p: jnp.sum(p.w))(batch)
    assert jnp.array_equal(out, jnp.array([4.0, 8.0]))


def test_vmap_returns_struct() -> None:
    """vmap can return a struct, with batched node fields."""
    out = jax.vmap(lambda x: Params(w=x, b=x * 2))(jnp.arange(3.0))
    assert type(out) is Params and out.w.shape == (3,)


def test_static_field_change_retraces_jit() -> None:
    """Each distinct static value is a separate jit specialisation."""
    traces: list[float] = []

    @jax.jit
    def f(p: Params) -> jax.Array:
        traces.append(p.lr)
        return p.w * p.lr

    f(Params(jnp.ones(2), jnp.ones(2), lr=0.1))
    f(Params(jnp.ones(2) * 5, jnp.zeros(2), lr=0.1))
    assert traces == [0.1]
    f(Params(jnp.ones(2), jnp.ones(2), lr=0.2))
    assert traces == [0.1, 0.2]


def test_static_field_is_a_python_value_under_jit() -> None:
    """Inside jit a static field is the concrete Python value, not a tracer."""
    seen: list[object] = []

    @jax.jit
    def f(p: Params) -> jax.Array:
        seen.append(p.lr)
        return p.w

    f(_params())
    assert seen == [1e-3]


def test_node_field_is_a_tracer_under_jit() -> None:
    """Inside jit a node field is a tracer."""
    seen: list[object] = []

    @jax.jit
    def f(p: Params) -> jax.Array:
        seen.append(p.w)
        return p.w

    f(_params())
    assert isinstance(seen[0], jax.core.Tracer)


# -- opaque fields -------------------------------------------------------------------


class WithHandle(js.Struct):
    x: object
    handle: object = js.field(pytree=False, default=None)


def test_opaque_field_is_not_a_leaf() -> None:
    """An opaque field contributes no leaves, even when it holds an array."""
    s = WithHandle(jnp.ones(2), handle=jnp.ones(3))
    assert len(jax.tree_util.tree_leaves(s)) == 1


def test_opaque_preserved_by_identity_through_tree_map() -> None:
    """tree_map keeps the very same opaque object."""
    handle = object()
    out = jax.tree_util.tree_map(lambda v: v * 2, WithHandle(jnp.ones(2), handle))
    assert out.handle is handle


def test_opaque_preserved_by_identity_through_jit() -> None:
    """An opaque object comes out of jit as the same object."""
    handle = object()
    out = jax.jit(lambda s: s)(WithHandle(jnp.ones(2), handle))
    assert out.handle is handle


def test_opaque_unhashable_value_works_under_jit() -> None:
    """An unhashable opaque value (a dict) does not break jit's cache."""
    cache: dict = {}
    f = jax.jit(lambda s: s.x + 1)
    assert f(WithHandle(jnp.ones(2), cache)).shape == (2,)


def test_opaque_array_is_not_traced() -> None:
    """An array in an opaque field stays concrete inside jit (invisible to the tracer)."""
    seen: list[object] = []

    @jax.jit
    def f(s: WithHandle) -> jax.Array:
        seen.append(s.handle)
        return s.x

    arr = np.ones(2)
    f(WithHandle(jnp.ones(2), arr))
    assert seen[0] is arr


def test_opaque_identity_change_retraces() -> None:
    """A different opaque object means a different tree structure (identity compare)."""
    a = jax.tree_util.tree_structure(WithHandle(1, object()))
    b = jax.tree_util.tree_structure(WithHandle(1, object()))
    assert a != b


def test_opaque_same_object_same_structure() -> None:
    """The same opaque object gives equal tree structures."""
    h = object()
    assert jax.tree_util.tree_structure(WithHandle(1, h)) == jax.tree_util.tree_structure(
        WithHandle(2, h)
    )


def test_grad_ignores_opaque_field() -> None:
    """grad does not differentiate opaque fields and keeps them."""
    h = object()
    g = jax.grad(lambda s: jnp.sum(s.x))(WithHandle(jnp.ones(2), h))
    assert g.handle is h


# -- unflatten never runs user hooks -------------------------------------------------


def _hooked(calls: list[str]) -> type:
    def conv(v: object) -> object:
        calls.append("convert")
        return v

    def val(v: object) -> bool:
        calls.append("validate")
        return True

    def der(self: object) -> int:
        calls.append("derived")
        return 1

    class Hooked(js.Struct):
        x: object = js.field(converter=conv, validator=val)
        d: int = js.field(static=True, init=False, derived=der)

        def __post_init__(self) -> None:
            calls.append("post_init")

    return Hooked


def test_unflatten_runs_no_hooks() -> None:
    """tree_unflatten never runs converters, validators, __post_init__ or derived."""
    calls: list[str] = []
    obj = _hooked(calls)(1.0)
    calls.clear()
    leaves, tree = jax.tree_util.tree_flatten(obj)
    jax.tree_util.tree_unflatten(tree, leaves)
    assert calls == []


def test_jit_runs_no_hooks() -> None:
    """Passing a struct through jit runs none of its hooks."""
    calls: list[str] = []
    obj = _hooked(calls)(jnp.ones(2))
    calls.clear()
    jax.jit(lambda s: s)(obj)
    assert calls == []


def test_vmap_and_grad_run_no_hooks() -> None:
    """vmap and grad rebuild structs without running hooks."""
    calls: list[str] = []
    obj = _hooked(calls)(jnp.ones(3))
    calls.clear()
    jax.vmap(lambda s: s.x * 2)(obj)
    jax.grad(lambda s: jnp.sum(s.x))(obj)
    assert calls == []


def test_unflatten_derived_value_comes_from_aux() -> None:
    """A rebuilt instance carries the derived value from the aux data."""
    calls: list[str] = []
    obj = _hooked(calls)(1.0)
    leaves, tree = jax.tree_util.tree_flatten(obj)
    assert jax.tree_util.tree_unflatten(tree, leaves).d == 1


@pytest.mark.parametrize("leaf", [None, object(), "text"], ids=["none", "object", "str"])
def test_unflatten_accepts_any_leaf(leaf: object) -> None:
    """tree_unflatten accepts leaves that the validators would reject."""

    class Strict(js.Struct):
        x: object = js.field(validator=lambda v: isinstance(v, float))

    tree = jax.tree_util.tree_structure(Strict(1.0))
    assert jax.tree_util.tree_unflatten(tree, [leaf]).x is leaf


def test_unflatten_accepts_tracers() -> None:
    """Inside jit a struct with converter jnp.asarray and a validator holds tracers."""

    class Strict(js.Struct):
        x: object = js.field(converter=float, validator=lambda v: v > 0)

    out = jax.jit(lambda s: s.x * 2)(Strict(2.0))
    assert float(out) == 4.0


def test_user_init_not_called_by_unflatten() -> None:
    """tree_unflatten does not call a user-written __init__."""
    calls: list[int] = []

    class P(js.Struct):
        x: object

        def __init__(self, x: object) -> None:
            calls.append(1)
            self.x = x

    obj = P(1.0)
    jax.tree_util.tree_map(lambda v: v, obj)
    assert calls == [1]


def test_flatten_unflatten_roundtrip_preserves_leaves_by_identity() -> None:
    """flatten then unflatten gives the same leaf objects."""
    p = _params()
    leaves, tree = jax.tree_util.tree_flatten(p)
    q = jax.tree_util.tree_unflatten(tree, leaves)
    assert q.w is p.w and q.b is p.b and q.lr == p.lr


def test_struct_with_no_node_fields_has_no_leaves() -> None:
    """A struct with only static fields flattens to no leaves and rebuilds."""

    class Cfg(js.Struct):
        n: int = js.field(static=True, default=3)

    leaves, tree = jax.tree_util.tree_flatten(Cfg())
    assert leaves == [] and jax.tree_util.tree_unflatten(tree, []).n == 3
