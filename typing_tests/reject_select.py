"""Rebuilt trees are typed: misuse of the result is caught; each bad line ends with the marker."""

import jaxstruct.core as js


class P(js.Struct):
    a: int
    b: int


p = P(a=1, b=2)

wrong: str = js.select(p).at(lambda t: t.b).apply(lambda v: v * 10)  # expected-error
js.select(p).at(lambda t: t.b).set(0).typo  # expected-error
js.select(p).at_leaves().apply(lambda v: v, keep_selected=True).a  # expected-error
numbers: list[str] = js.select([1, 2]).at_leaves().remove()  # expected-error
js.tree_at(lambda t: t.b, p, replace=3).c  # expected-error
js.select(p).at_leaves().set(0, keep_selected=1)  # expected-error
