"""``tree_at``: one-shot functional updates for equinox users."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest


class Layer(js.Struct):
    w: object
    b: object = None
    act: str = js.field(static=True, default="relu")


class Scaled(js.Struct):
    v: object = js.field(converter=jnp.asarray)


def test_replace_single_node() -> None:
    """replace= puts one value where the accessor points."""
    assert js.tree_at(lambda t: t.b, Layer(w=1.0), replace=2.0) == Layer(w=1.0, b=2.0)


def test_replace_several_nodes_in_where_order() -> None:
    """With several nodes, replace= gives one value per node in the accessor's order."""
    tree = {"x": 1, "y": 2}
    assert js.tree_at(lambda t: (t["y"], t["x"]), tree, replace=("Y", "X")) == {"x": "X", "y": "Y"}


def test_replace_fn() -> None:
    """replace_fn= maps each picked node."""
    out = js.tree_at(lambda t: t.w, Layer(w=jnp.ones(2)), replace_fn=lambda w: w * 3)
    np.testing.assert_array_equal(out.w, np.full(2, 3.0))


def test_needs_exactly_one_replacement() -> None:
    """Passing both or neither of replace= and replace_fn= raises SelectionError."""
    with pytest.raises(js.SelectionError, match="exactly one"):
        js.tree_at(lambda t: t.w, Layer(w=1.0))
    with pytest.raises(js.SelectionError, match="exactly one"):
        js.tree_at(lambda t: t.w, Layer(w=1.0), replace=1, replace_fn=abs)


def test_replacement_count_must_match() -> None:
    """A replace= sequence of the wrong length raises SelectionError."""
    with pytest.raises(js.SelectionError, match="picked 2 node"):
        js.tree_at(lambda t: (t.w, t.b), Layer(w=1.0, b=2.0), replace=(1,))


def test_is_leaf_treats_subtree_as_node() -> None:
    """is_leaf lets the accessor pick a subtree that it treats as a single node."""
    tree = [(1, 2), 3]
    out = js.tree_at(lambda t: t[0], tree, replace="pair", is_leaf=lambda x: isinstance(x, tuple))
    assert out == ["pair", 3]


def test_static_field_cannot_be_picked() -> None:
    """A static field is no pytree node: tree_at raises SelectionError pointing to replace()."""
    with pytest.raises(js.SelectionError, match=r"\.replace\(\)"):
        js.tree_at(lambda t: t.act, Layer(w=1.0), replace="tanh")


def test_converter_reruns_on_replaced_field() -> None:
    """A replaced struct field is re-converted by its converter."""
    out = js.tree_at(lambda t: t.v, Scaled(v=[1.0]), replace=[1.0, 2.0])
    assert isinstance(out.v, jax.Array)


def test_under_jit() -> None:
    """tree_at works inside jit."""
    out = jax.jit(lambda t: js.tree_at(lambda s: s.w, t, replace_fn=jnp.sin))(Layer(w=jnp.zeros(2)))
    np.testing.assert_array_equal(out.w, np.zeros(2))
