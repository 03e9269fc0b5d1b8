"""Selectors penzai users reach for, structural edits, and holes moved inside a remainder."""

from __future__ import annotations

import ast
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from jaxstruct.core import Selection, SelectionError

DictKey = jax.tree_util.DictKey
SequenceKey = jax.tree_util.SequenceKey
GetAttrKey = jax.tree_util.GetAttrKey
SELECT_DIR = Path(js.__file__).parent / "_select"


class Block(js.Struct):
    layers: list
    act: str = js.field(static=True, default="relu")


class Scaled(js.Struct):
    v: object = js.field(converter=jnp.asarray)


# -- holes that move inside the remainder (issue 11, item 12) ----------------------------


def _inner() -> Selection[dict[str, dict[str, int]]]:
    return js.select({"a": {"x": 1}}).at(lambda t: t["a"]["x"])


def test_moved_hole_is_filled_where_it_now_is() -> None:
    """A hole moved by editing the remainder through an outer selection is filled in place."""
    moved = js.select(_inner()).at(lambda s: s.remainder["a"]).apply(lambda d: [d])
    assert moved.apply(lambda v: v + 1) == {"a": [{"x": 2}]}


def test_moved_hole_never_stays_in_the_output() -> None:
    """No SelectionHole is left anywhere in a tree rebuilt from an edited remainder."""
    moved = js.select(_inner()).at(lambda s: s.remainder["a"]).apply(lambda d: {"y": d})
    out = moved.deselect()
    leaves = jax.tree_util.tree_leaves(out, is_leaf=lambda x: isinstance(x, js.SelectionHole))
    assert out == {"a": {"y": {"x": 1}}}
    assert not any(isinstance(x, js.SelectionHole) for x in leaves)


def test_moved_hole_is_not_mistaken_for_what_now_sits_at_its_path() -> None:
    """A value now at the hole's old path is kept; the value goes where the hole went."""
    moved = js.select(_inner()).at(lambda s: s.remainder["a"]).apply(lambda d: {"x": 5, "y": d})
    assert moved.set(0) == {"a": {"x": 5, "y": {"x": 0}}}


def test_dropped_hole_is_an_error() -> None:
    """A remainder edited so that a hole is gone cannot be rebuilt: SelectionError names it."""
    dropped = js.select(_inner()).at(lambda s: s.remainder["a"]).set(0)
    with pytest.raises(SelectionError, match=r"\['a'\]\['x'\] is gone"):
        dropped.apply(lambda v: v + 1)


def test_duplicated_hole_is_an_error() -> None:
    """A hole copied twice into the remainder is ambiguous: SelectionError."""
    doubled = js.select(_inner()).at(lambda s: s.remainder["a"]).apply(lambda d: [d, d])
    with pytest.raises(SelectionError, match="appears 2 times"):
        doubled.deselect()


def test_moved_hole_refines_and_splices() -> None:
    """Refining and structural edits also find a moved hole."""
    moved = js.select(_inner()).at(lambda s: s.remainder["a"]).apply(lambda d: [d])
    assert moved.at_equal_to(1).set(7) == {"a": [{"x": 7}]}
    listed = js.select({"a": [1, 2]}).at(lambda t: t["a"][0])
    shifted = js.select(listed).at(lambda s: s.remainder["a"]).apply(lambda xs: [[*xs]])
    assert shifted.remove() == {"a": [[2]]}


# -- penzai's selectors under their names or ours (item 13) -------------------------------


def test_at_equal_to_selects_outermost_equal_subtrees() -> None:
    """at_equal_to selects subtrees equal to the value, outermost first."""
    tree = {"a": [1, 2], "b": [1, 2], "c": 1}
    sel = js.select(tree).at_equal_to([1, 2])
    assert sel.get_keypaths() == ((DictKey("a"),), (DictKey("b"),))


def test_at_equal_to_skips_arrays() -> None:
    """Arrays are never compared by at_equal_to (their == is elementwise)."""
    tree = {"w": jnp.zeros(2), "n": 0, "m": np.zeros(3)}
    assert js.select(tree).at_equal_to(0).get_keypaths() == ((DictKey("n"),),)


def test_at_equal_to_looks_past_containers_of_arrays() -> None:
    """A list holding arrays (whose == cannot give a bool) is not equal, and is looked into."""
    tree = {"xs": [jnp.ones(2), 1], "ys": [1]}
    assert js.select(tree).at_equal_to([1]).get_keypaths() == ((DictKey("ys"),),)
    assert js.select(tree).at_equal_to(1).count() == 2


def test_at_equal_to_works_under_jit() -> None:
    """Traced leaves are skipped, so at_equal_to runs inside jit."""

    @jax.jit
    def f(tree: dict[str, object]) -> dict[str, object]:
        return js.select(tree).at_equal_to(None).remove()

    out = f({"xs": [jnp.ones(2), None, jnp.zeros(1)]})
    assert [x.shape for x in out["xs"]] == [(2,), (1,)]


def test_at_equal_to_refuses_an_array_value() -> None:
    """Looking for an array with at_equal_to is a SelectionError pointing elsewhere."""
    with pytest.raises(SelectionError, match="at_subtrees_where"):
        js.select([1]).at_equal_to(np.zeros(2))


def test_at_childless_selects_leaves_and_empty_nodes() -> None:
    """at_childless selects leaves and childless nodes (None, (), empty structs)."""

    class Empty(js.Struct):
        tag: str = js.field(static=True, default="e")

    tree = {"a": 1, "b": None, "c": (), "d": Empty(), "e": [2]}
    got = js.select(tree).at_childless().get_sequence()
    assert got == (1, None, (), Empty(), 2)


def test_pick_keeps_the_given_indices() -> None:
    """pick(i, ...) keeps the i-th selected subtrees, negative indices from the end."""
    sel = js.select([10, 20, 30]).at_leaves().pick(1, -1)
    assert sel.get_sequence() == (20, 30)
    assert sel.deselect() == [10, 20, 30]


def test_pick_out_of_range_is_an_error() -> None:
    """pick() with an index out of range is a SelectionError naming the range."""
    with pytest.raises(SelectionError, match="from -2 to 1"):
        js.select([1, 2]).at_leaves().pick(2)


def test_refine_selects_per_subtree() -> None:
    """refine(fn) selects inside each selected subtree what fn's selection selects."""
    tree = {"short": [1, 2], "long": [3, 4, 5]}
    sel = js.select(tree).at_children().refine(lambda xs: js.select(xs).at_children().pick(-1))
    assert sel.get_keypaths() == (
        (DictKey("long"), SequenceKey(2)),
        (DictKey("short"), SequenceKey(1)),
    )
    assert sel.set(0) == {"short": [1, 0], "long": [3, 4, 0]}


def test_refine_may_change_the_subtree() -> None:
    """A refine selector may return a selection of a changed subtree, which takes its place."""
    sel = js.select([[1], [2]]).at_children().refine(lambda xs: js.select([*xs, 0]).at_leaves())
    assert sel.deselect() == [[1, 0], [2, 0]]
    assert sel.count() == 4


def test_refine_needs_a_selection() -> None:
    """A refine selector that returns something else is a SelectionError."""
    with pytest.raises(SelectionError, match="not a Selection"):
        js.select([[1]]).at_children().refine(lambda xs: xs)  # type: ignore[arg-type,return-value]


def test_set_by_path_with_mapping_and_function() -> None:
    """set_by_path takes a mapping of selected paths, or a function of the path."""
    sel = js.select({"a": 1, "b": 2}).at_leaves()
    assert sel.set_by_path({(DictKey("a"),): 10, (DictKey("b"),): 20}) == {"a": 10, "b": 20}
    assert sel.set_by_path(lambda p: p[0].key) == {"a": "a", "b": "b"}


def test_set_by_path_mismatched_keys_are_an_error() -> None:
    """A set_by_path mapping missing a selected path, or with an unselected one, is an error."""
    sel = js.select({"a": 1, "b": 2}).at_leaves()
    with pytest.raises(SelectionError, match=r"no value for \['b'\]; \['c'\] is not selected"):
        sel.set_by_path({(DictKey("a"),): 1, (DictKey("c"),): 3})


def test_set_at_keypaths_sets_relative_paths_in_each_subtree() -> None:
    """set_at_keypaths sets nodes at paths relative to every selected subtree."""
    tree = [Block(layers=[1, 2]), Block(layers=[3])]
    first = (GetAttrKey("layers"), SequenceKey(0))
    out = js.select(tree).at_instances_of(Block).set_at_keypaths({first: 0})
    assert out == [Block(layers=[0, 2]), Block(layers=[0])]


def test_set_at_keypaths_unknown_path_is_an_error() -> None:
    """A set_at_keypaths path found in no selected subtree is a SelectionError."""
    with pytest.raises(SelectionError, match="exists in none"):
        js.select({"a": 1}).set_at_keypaths({(DictKey("zz"),): 0})


def test_apply_with_index_passes_tree_order_indices() -> None:
    """apply_with_index(fn) calls fn(i, subtree) with i the index in tree order."""
    out = js.select({"b": 0, "a": 0}).at_leaves().apply_with_index(lambda i, v: i)
    assert out == {"a": 0, "b": 1}
    kept = js.select([5, 5]).at_leaves().apply_with_index(lambda i, v: v + i, keep_selected=True)
    assert kept.get_sequence() == (5, 6)


def test_apply_with_index_reconverts_whole_fields() -> None:
    """apply_with_index runs the converter of a struct field it replaces as a whole."""
    out = js.select(Scaled(v=1.0)).at(lambda s: s.v).apply_with_index(lambda i, v: [2.0])
    assert isinstance(out.v, jax.Array)


def test_fields_deep_in_containers_are_reconverted() -> None:
    """Struct fields reached through dicts and lists are still found and re-converted."""
    tree = {"blocks": [Scaled(v=0.0), Scaled(v=1.0)], "n": (Scaled(v=2.0),)}
    out = js.select(tree).at_instances_of(Scaled).at(lambda s: s.v).set([5.0])
    assert all(isinstance(s.v, jax.Array) for s in [*out["blocks"], *out["n"]])


# -- structural edits (item 13) --------------------------------------------------------------


def test_remove_drops_list_and_tuple_elements() -> None:
    """remove() drops each selected element from its list or tuple."""
    tree = {"xs": [1, None, 2, None], "ys": (None, 3)}
    assert js.select(tree).at_equal_to(None).remove() == {"xs": [1, 2], "ys": (3,)}


def test_remove_in_nested_lists_keeps_paths_straight() -> None:
    """Removing in an outer list and in a list inside a later element both apply."""
    tree = [0, [0, 1], 2]
    assert js.select(tree).at_equal_to(0).remove() == [[1], 2]


def test_remove_outside_a_list_is_an_error() -> None:
    """remove() on a dict value or struct field is a SelectionError naming the parent type."""
    with pytest.raises(SelectionError, match=r"\['a'\] is inside a dict"):
        js.select({"a": 1}).at_leaves().remove()
    with pytest.raises(SelectionError, match="Block"):
        js.select(Block(layers=[1])).at(lambda b: b.layers).remove()


def test_remove_root_is_an_error() -> None:
    """The root has no parent to be removed from."""
    with pytest.raises(SelectionError, match="root"):
        js.select([1]).remove()


def test_insert_before_and_after() -> None:
    """insert_before/insert_after put a value next to each selected element."""
    sel = js.select(["a", "b"]).at_leaves()
    assert sel.insert_before("-") == ["-", "a", "-", "b"]
    assert sel.insert_after("-") == ["a", "-", "b", "-"]


def test_insert_can_select_the_inserted() -> None:
    """select_inserted=True returns a selection of the inserted elements."""
    tree = {"layers": [1, [2]]}
    sel = js.select(tree).at_equal_to(2).insert_after(9, select_inserted=True)
    assert isinstance(sel, Selection)
    assert sel.get_keypaths() == ((DictKey("layers"), SequenceKey(1), SequenceKey(1)),)
    assert sel.set(0) == {"layers": [1, [2, 0]]}


def test_insert_inside_a_struct_list_field() -> None:
    """Inserting into a list field rebuilds the struct around the new list."""
    out = js.select(Block(layers=[1, 2])).at_equal_to(2).insert_before(0)
    assert out == Block(layers=[1, 0, 2])


def test_splice_replaces_an_element_by_several() -> None:
    """splice(fn) replaces each element by the elements fn returns (with key paths)."""
    tree = (1, 2)
    out = js.select(tree).at_leaves().splice(lambda p, v: [v] * (p[0].idx + 1), with_keypath=True)
    assert out == (1, 2, 2)


def test_structural_edits_work_under_jit() -> None:
    """Removing and inserting only look at structure, so they work on traced values."""

    @jax.jit
    def f(xs: list[jax.Array]) -> list[jax.Array]:
        return js.select(xs).at_children().pick(0).insert_after(xs[0] * 2)

    out = f([jnp.ones(2), jnp.zeros(2)])
    assert [float(x[0]) for x in out] == [1.0, 2.0, 0.0]


# -- module layout -----------------------------------------------------------------------------


def test_selector_modules_stay_small() -> None:
    """No selector module is a 700-line room: each stays under 400 lines."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in SELECT_DIR.glob("*.py")}
    assert sizes and max(sizes.values()) < 400, sizes


def test_struct_module_does_not_import_selectors_at_run_time() -> None:
    """_struct imports _select only for type checking (Struct.select imports lazily)."""
    tree = ast.parse((SELECT_DIR.parent / "_struct.py").read_text())
    top_level = [
        node
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and "_select" in node.module
    ]
    assert top_level == []
