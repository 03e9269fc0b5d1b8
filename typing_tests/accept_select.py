"""Selections keep the tree's type: rebuilding returns what was selected from."""

from typing import assert_type

import jaxstruct.core as js


class P(js.Struct):
    a: int
    b: int


p = P(a=1, b=2)
tree = {"a": [1, 2], "b": [3]}

assert_type(js.select(p), js.Selection[P])
assert_type(p.select(), js.Selection[P])
assert_type(js.select(p).at(lambda t: t.b).apply(lambda v: v * 10), P)
assert_type(p.select().at(lambda t: t.b).set(3), P)
assert_type(js.select(p).at_instances_of(int).set_sequence([1, 2]), P)
assert_type(js.select(p).at_leaves().apply(lambda v: v, keep_selected=True), js.Selection[P])
assert_type(js.select(p).at_leaves().apply(lambda k, v: v, with_keypath=True), P)
assert_type(js.select(p).at_leaves().apply_with_index(lambda i, v: v + i), P)
assert_type(js.select(p).at_leaves().deselect(), P)
assert_type(js.select(tree).at_equal_to(2).remove(), dict[str, list[int]])
assert_type(js.select(tree).at_equal_to(2).insert_after(0), dict[str, list[int]])
assert_type(
    js.select(tree).at_equal_to(2).insert_before(0, select_inserted=True),
    js.Selection[dict[str, list[int]]],
)
assert_type(
    js.select(tree).at_children().pick(0).refine(js.select).invert(),
    js.Selection[dict[str, list[int]]],
)
assert_type(js.tree_at(lambda t: t.b, p, replace=3), P)

rebuilt: P = js.select(p).at(lambda t: t.a).set(0)
total: int = js.select(p).at(lambda t: t.a).set(0).a + 1
