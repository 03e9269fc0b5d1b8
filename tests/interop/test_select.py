"""Selectors: ``select``, ``Selection`` and ``SelectionHole`` (reference 004)."""

from __future__ import annotations

from collections import namedtuple

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from jaxstruct.core import Selection, SelectionError, SelectionHole

GetAttrKey = jax.tree_util.GetAttrKey
DictKey = jax.tree_util.DictKey
SequenceKey = jax.tree_util.SequenceKey


class Linear(js.Struct):
    w: object
    b: object
    name: str = js.field(static=True, default="linear")


class MLP(js.Struct):
    layers: list
    scale: float = 1.0


class Hooked(js.Struct):
    """Counts every user hook that runs, to prove rebuilding runs none."""

    x: object = js.field(converter=lambda v: ("converted", v))
    y: object = js.field(default=0, validator=lambda v: True)
    calls: object = js.field(pytree=False, default=None)

    def __post_init__(self) -> None:
        HOOK_CALLS.append("post_init")


HOOK_CALLS: list[str] = []


def _mlp() -> MLP:
    return MLP(
        layers=[
            Linear(w=jnp.ones((2, 3)), b=jnp.zeros(3), name="in"),
            Linear(w=jnp.ones((3, 1)), b=jnp.zeros(1), name="out"),
        ]
    )


def test_select_holds_whole_tree() -> None:
    """select(tree) selects the root, and deselect() gives the tree back."""
    tree = {"a": 1, "b": [2, 3]}
    sel = js.select(tree)
    assert sel.count() == 1
    assert sel.get() is tree
    assert sel.get_keypaths() == ((),)
    assert sel.deselect() is tree


def test_struct_select_method() -> None:
    """Struct.select() is select(self)."""
    m = _mlp()
    assert m.select().get() is m
    assert isinstance(m.select(), Selection)


def test_at_instances_of_selects_outermost() -> None:
    """at_instances_of selects every outermost instance, in tree order."""
    m = _mlp()
    sel = js.select(m).at_instances_of(Linear)
    assert sel.count() == 2
    assert [layer.name for layer in sel.get_sequence()] == ["in", "out"]
    assert sel.get_keypaths()[1] == (GetAttrKey("layers"), SequenceKey(1))


def test_at_instances_of_innermost() -> None:
    """innermost=True prefers nested instances over their ancestors."""
    tree = [[1, [2]], 3]
    outer = js.select(tree).at_instances_of(list)
    inner = js.select(tree).at_instances_of(list, innermost=True)
    assert outer.get() is tree
    assert inner.get_sequence() == ([2],)


def test_at_instances_of_rejects_non_classes() -> None:
    """at_instances_of() needs classes."""
    with pytest.raises(TypeError, match="expected one or more classes"):
        js.select([1]).at_instances_of("int")  # type: ignore[arg-type]


def test_selected_subtrees_become_holes() -> None:
    """The remainder holds a childless SelectionHole carrying the key path."""
    sel = js.select(_mlp()).at_instances_of(Linear)
    holes = sel.remainder.layers
    assert all(isinstance(h, SelectionHole) for h in holes)
    assert holes[0].path == (GetAttrKey("layers"), SequenceKey(0))
    assert jax.tree_util.tree_leaves(holes[0]) == []
    assert jax.tree_util.tree_leaves(sel.remainder) == [1.0]


def test_apply_rebuilds_with_changes() -> None:
    """apply(fn) replaces each selected subtree by fn(subtree) and rebuilds."""
    m = _mlp()
    new = js.select(m).at_instances_of(Linear).apply(lambda layer: layer.replace(b=layer.b + 1))
    assert isinstance(new, MLP)
    np.testing.assert_array_equal(new.layers[0].b, np.ones(3))
    assert new.layers[1].name == "out"


def test_apply_with_keypath() -> None:
    """with_keypath=True passes the key path from the root first."""
    got = (
        js.select({"a": 1, "b": 2})
        .at_leaves()
        .apply(lambda p, v: jax.tree_util.keystr(p), with_keypath=True)
    )
    assert got == {"a": "['a']", "b": "['b']"}


def test_apply_keep_selected_returns_selection() -> None:
    """keep_selected=True returns the updated selection, still selected."""
    sel = js.select([1, 2]).at_leaves().apply(lambda v: v * 10, keep_selected=True)
    assert isinstance(sel, Selection)
    assert sel.get_sequence() == (10, 20)
    assert sel.deselect() == [10, 20]


def test_untouched_subtrees_keep_identity() -> None:
    """Rebuilding reuses every subtree that holds no selected node."""
    m = _mlp()
    new = js.select(m).at(lambda t: t.layers[1].b).set(jnp.ones(1))
    assert new.layers[0] is m.layers[0]
    assert new.layers[1].w is m.layers[1].w


def test_set_replaces_every_selected() -> None:
    """set(value) puts the same value at every selected position."""
    assert js.select([1, "a", 2]).at_instances_of(int).set(0) == [0, "a", 0]


def test_set_sequence_in_tree_order() -> None:
    """set_sequence puts one value per selected subtree, in tree order."""
    assert js.select({"b": 1, "a": 2}).at_leaves().set_sequence(["A", "B"]) == {"a": "A", "b": "B"}


def test_set_sequence_length_mismatch_fails() -> None:
    """set_sequence with the wrong number of values raises SelectionError."""
    with pytest.raises(SelectionError, match="2 selected"):
        js.select([1, 2]).at_leaves().set_sequence([1])


def test_get_requires_exactly_one() -> None:
    """get() on zero or several selected subtrees raises SelectionError (a ValueError)."""
    with pytest.raises(SelectionError, match="exactly one"):
        js.select([1, 2]).at_leaves().get()
    with pytest.raises(ValueError, match="got 0"):
        js.select([1, 2]).at_instances_of(str).get()


def test_count_and_is_empty() -> None:
    """count() and len() give the number selected; is_empty() says when it is zero."""
    sel = js.select([1, (2, 3)]).at_leaves()
    assert sel.count() == len(sel) == 3
    assert js.select([1]).at_instances_of(str).is_empty()


def test_at_leaves_skips_none_and_empty_nodes() -> None:
    """at_leaves() selects JAX leaves only: None and empty containers are not leaves."""
    sel = js.select({"a": None, "b": (), "c": [1, 2]}).at_leaves()
    assert sel.get_sequence() == (1, 2)


def test_at_children() -> None:
    """at_children() selects the direct children of each selected subtree."""
    assert js.select({"a": [1, 2], "b": 3}).at_children().get_sequence() == ([1, 2], 3)


def test_at_accessor_selects_one_node() -> None:
    """at(lambda x: x.a.b) selects the node the accessor navigates to."""
    m = _mlp()
    sel = js.select(m).at(lambda t: t.layers[0].w)
    assert sel.get() is m.layers[0].w
    assert sel.get_keypaths() == ((GetAttrKey("layers"), SequenceKey(0), GetAttrKey("w")),)


def test_at_accessor_tuple_selects_several() -> None:
    """An accessor returning a tuple of nodes selects each of them."""
    m = _mlp()
    sel = js.select(m).at(lambda t: (t.layers[1].b, t.layers[0].b))
    assert sel.count() == 2
    assert sel.get_sequence()[0] is m.layers[0].b


def test_at_accessor_can_select_none_field() -> None:
    """A None field (an empty subtree) can be selected and replaced."""
    new = js.select(Linear(w=1.0, b=None)).at(lambda t: t.b).set(2.0)
    assert new == Linear(w=1.0, b=2.0)


def test_at_accessor_can_select_a_container_node() -> None:
    """The accessor may return an inner container (a list field) itself."""
    m = _mlp()
    assert js.select(m).at(lambda t: t.layers).get() is m.layers


def test_at_refines_each_selected_subtree() -> None:
    """at() after at_instances_of applies the accessor inside every selected subtree."""
    new = js.select(_mlp()).at_instances_of(Linear).at(lambda layer: layer.b).set(None)
    assert [layer.b for layer in new.layers] == [None, None]


def test_at_static_field_fails() -> None:
    """Static fields are not pytree children: at() on one raises SelectionError."""
    with pytest.raises(SelectionError, match="static and opaque"):
        js.select(_mlp()).at(lambda t: t.layers[0].name)


def test_at_reading_leaf_values_fails() -> None:
    """An accessor that computes with leaf values raises SelectionError."""
    with pytest.raises(SelectionError, match="only navigate"):
        js.select(_mlp()).at(lambda t: t.layers[0].w.T)


def test_at_nested_nodes_fail() -> None:
    """Selecting a node and one of its descendants at once raises SelectionError."""
    with pytest.raises(SelectionError, match="cannot nest"):
        js.select(_mlp()).at(lambda t: (t.layers[0], t.layers[0].w))


def test_at_keypaths_relative() -> None:
    """at_keypaths selects by key paths relative to each selected subtree."""
    sel = js.select(_mlp()).at_instances_of(Linear).at_keypaths([(GetAttrKey("b"),)])
    assert sel.count() == 2
    assert sel.get_keypaths()[0] == (GetAttrKey("layers"), SequenceKey(0), GetAttrKey("b"))


def test_at_keypaths_missing_path_selects_nothing() -> None:
    """A key path absent from the tree selects nothing."""
    assert js.select({"a": 1}).at_keypaths([(DictKey("zzz"),)]).is_empty()


def test_at_keypaths_prefix_wins() -> None:
    """When one path is a prefix of another, the shorter one is selected."""
    sel = js.select({"a": [1, 2]}).at_keypaths([(DictKey("a"),), (DictKey("a"), SequenceKey(0))])
    assert sel.get() == [1, 2]


def test_where_filters_selected() -> None:
    """where(pred) keeps the selected subtrees where pred is true and puts back the rest."""
    sel = js.select([1, 5, 2]).at_leaves().where(lambda x: x > 1)
    assert sel.get_sequence() == (5, 2)
    assert sel.set(0) == [1, 0, 0]


def test_where_with_keypath() -> None:
    """where(..., with_keypath=True) passes the key path from the root."""
    sel = (
        js.select({"a": 1, "b": 2})
        .at_leaves()
        .where(lambda p, _: p == (DictKey("b"),), with_keypath=True)
    )
    assert sel.get() == 2


def test_at_subtrees_where_predicate_must_be_bool() -> None:
    """A predicate returning an array instead of a bool raises SelectionError."""
    with pytest.raises(SelectionError, match="must return a bool"):
        js.select([jnp.ones(2)]).at_subtrees_where(lambda x: jnp.asarray(True))


def test_invert_selects_the_rest() -> None:
    """invert() selects the largest subtrees that hold nothing selected."""
    tree = {"a": 1, "b": {"c": 2, "d": 3}}
    inv = js.select(tree).at(lambda t: t["b"]["c"]).invert()
    assert inv.get_sequence() == (1, 3)
    assert inv.set(0) == {"a": 0, "b": {"c": 2, "d": 0}}


def test_invert_of_whole_tree_is_empty() -> None:
    """Inverting a selection of the root selects nothing."""
    assert js.select([1, 2]).invert().is_empty()


def test_deselect_restores_original() -> None:
    """deselect() after refining gives a tree equal to the original."""
    m = _mlp()
    back = js.select(m).at_instances_of(Linear).at(lambda layer: layer.w).deselect()
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(m)
    assert back.layers[0].w is m.layers[0].w


def test_rebuild_runs_no_user_hooks() -> None:
    """Selecting and rebuilding never runs __init__, __post_init__ or validators."""
    h = Hooked(x=1)
    HOOK_CALLS.clear()
    new = js.select({"h": h}).at(lambda t: t["h"].y).set(5)
    assert HOOK_CALLS == []
    assert new["h"].y == 5
    assert new["h"].x == ("converted", 1)


def test_changed_field_is_reconverted() -> None:
    """A struct field replaced as a whole goes through the field's converter."""
    h = Hooked(x=1)
    new = js.select(h).at(lambda t: t.x).set(2)
    assert new.x == ("converted", 2)


def test_unchanged_field_is_not_reconverted() -> None:
    """Returning the very same object does not re-run the converter."""
    h = Hooked(x=1)
    new = js.select(h).at(lambda t: t.x).apply(lambda v: v)
    assert new.x == ("converted", 1)


def test_value_inside_field_is_not_reconverted() -> None:
    """A change deeper inside a field does not run that field's converter."""
    h = Hooked(x=1).replace(y=[1, 2])
    new = js.select(h).at(lambda t: t.y[0]).set(9)
    assert new.y == [9, 2]


def test_converter_runs_on_field_set_as_array() -> None:
    """Setting an array field to a list converts it back to an array."""

    class Arr(js.Struct):
        v: object = js.field(converter=jnp.asarray)

    new = js.select(Arr(v=[1.0])).at(lambda t: t.v).set([2.0, 3.0])
    assert isinstance(new.v, jax.Array)
    assert new.v.shape == (2,)


def test_plain_containers() -> None:
    """Selection works on dicts, lists, tuples and namedtuples."""
    Pair = namedtuple("Pair", "x y")
    tree = {"t": (1, [2, Pair(3, 4)])}
    assert js.select(tree).at(lambda t: t["t"][1][1].y).set(0) == {"t": (1, [2, Pair(3, 0)])}


def test_registered_foreign_class() -> None:
    """Classes registered with register_pytree_type / register_attrs_type can be selected into."""

    class Box:
        def __init__(self, inner: object, label: str) -> None:
            self.inner, self.label = inner, label

    js.register_attrs_type(Box, node_fields=("inner",), static_fields=("label",))

    class Wrap:
        def __init__(self, item: object) -> None:
            self.item = item

    js.register_pytree_type(
        Wrap, flatten=lambda w: ((w.item,), None), unflatten=lambda _, ch: Wrap(*ch)
    )
    tree = Wrap(Box(inner=[1, 2], label="k"))
    new = js.select(tree).at(lambda t: t.item.inner[1]).set(20)
    assert isinstance(new, Wrap)
    assert new.item.inner == [1, 20]
    assert new.item.label == "k"


def test_opaque_fields_carried_through() -> None:
    """Opaque fields of rebuilt structs are the very same objects."""
    marker = object()
    h = Hooked(x=1).replace(calls=marker)
    new = js.select(h).at(lambda t: t.y).set(3)
    assert new.calls is marker


def test_under_jit() -> None:
    """Selecting and applying works on traced values inside jit."""

    @jax.jit
    def bump(m: MLP) -> MLP:
        return (
            js.select(m).at_instances_of(Linear).at(lambda layer: layer.b).apply(lambda b: b + 1.0)
        )

    out = bump(_mlp())
    np.testing.assert_array_equal(out.layers[1].b, np.ones(1))


def test_selection_is_a_pytree() -> None:
    """A Selection crosses jit boundaries; its leaves are the tree's leaves."""
    m = _mlp()
    sel = jax.jit(lambda t: js.select(t).at_instances_of(Linear))(m)
    assert isinstance(sel, Selection)
    assert sel.count() == 2
    assert len(jax.tree_util.tree_leaves(sel)) == len(jax.tree_util.tree_leaves(m))


def test_tree_containing_holes_is_safe() -> None:
    """A tree that already contains SelectionHole objects can be selected and rebuilt."""
    tree = {"hole": SelectionHole((DictKey("x"),)), "v": 1}
    new = js.select(tree).at(lambda t: t["v"]).set(2)
    assert new == {"hole": SelectionHole((DictKey("x"),)), "v": 2}


def test_selection_repr_names_paths() -> None:
    """repr(Selection) lists how many subtrees are selected and where."""
    assert repr(js.select({"a": 1}).at_leaves()) == "Selection(1 selected: ['a'])"
