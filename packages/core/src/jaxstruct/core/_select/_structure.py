"""Structural edits of list and tuple elements: ``splice``, ``remove``, ``insert_before/after``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal, Self, overload

import jax

from ._traverse import Traversal
from ._tree import KeyPath, SelectionError, SelectionHole, T, Trie, children, relocate

__all__ = ["Structural"]

# expand(path, value) -> the items (and whether to select each) that replace one element.
_Expand = Callable[[KeyPath, Any], Iterable[tuple[Any, bool]]]


class _Moved(Exception):
    """A hole is not where its path says (the remainder was edited): look them up instead."""


class Structural(Traversal[T]):
    """The methods that change how many elements a list or tuple holds."""

    __slots__ = ()

    def _splice(self, expand: _Expand, what: str) -> tuple[Any, list[KeyPath]]:
        items = list(zip(self.paths, self.selected, strict=True))
        if any(not path for path, _ in items):
            raise SelectionError(
                f"{what}: the root of the tree is selected, and it has no parent list or tuple "
                "to remove it from or insert next to it; select list or tuple elements"
            )
        try:
            trie = Trie.build((path, (path, value)) for path, value in items)
            return _walk(self.remainder, (), trie, expand, what)
        except _Moved:
            moved = relocate(self.remainder, [p for p, _ in items])
            trie = Trie.build((moved[path], (path, value)) for path, value in items)
            return _walk(self.remainder, (), trie, expand, what, check=False)

    def splice(self, fn: Callable[..., Iterable[Any]], *, with_keypath: bool = False) -> T:
        """Replace each selected list or tuple element by the elements ``fn`` returns.

        ``fn(subtree)`` (or ``fn(keypath, subtree)``) returns an iterable of
        new elements: none removes the element, several insert them all in
        its place. penzai calls this ``apply_and_inline``.

        Raises:
            SelectionError: a selected subtree is the root, or is not an
                element of a plain ``list`` or ``tuple``.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select([1, 2, 3]).at_equal_to(2).splice(lambda v: [v, v * 10])
            [1, 2, 20, 3]
        """

        def expand(path: KeyPath, value: Any) -> Iterable[tuple[Any, bool]]:
            new = fn(path, value) if with_keypath else fn(value)
            return [(item, False) for item in new]

        return self._splice(expand, "splice()")[0]

    def remove(self) -> T:
        """Remove each selected element from its list or tuple; penzai: ``remove_from_parent``.

        Raises:
            SelectionError: a selected subtree is not an element of a ``list`` or ``tuple``.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select({"xs": [1, None, 2]}).at_equal_to(None).remove()
            {'xs': [1, 2]}
        """
        return self._splice(lambda _path, _value: (), "remove()")[0]

    @overload
    def insert_before(self, value: Any, *, select_inserted: Literal[False] = False) -> T: ...
    @overload
    def insert_before(self, value: Any, *, select_inserted: Literal[True]) -> Self: ...
    def insert_before(self, value: Any, *, select_inserted: bool = False) -> T | Self:
        """Insert ``value`` before each selected list or tuple element.

        Args:
            value: the element to insert (the same object at every place).
            select_inserted: return a selection of the inserted elements instead
                of the tree (penzai's ``and_select``).

        Example:
            >>> import jaxstruct.core as js
            >>> js.select(["a", "b"]).at_equal_to("b").insert_before("x")
            ['a', 'x', 'b']
        """
        return self._insert(lambda old: [(value, True), (old, False)], select_inserted)

    @overload
    def insert_after(self, value: Any, *, select_inserted: Literal[False] = False) -> T: ...
    @overload
    def insert_after(self, value: Any, *, select_inserted: Literal[True]) -> Self: ...
    def insert_after(self, value: Any, *, select_inserted: bool = False) -> T | Self:
        """Insert ``value`` after each selected list or tuple element.

        Example:
            >>> import jaxstruct.core as js
            >>> sel = js.select((1, 2)).at_leaves().insert_after(0, select_inserted=True)
            >>> sel.deselect(), sel.count()
            ((1, 0, 2, 0), 2)
        """
        return self._insert(lambda old: [(old, False), (value, True)], select_inserted)

    def _insert(
        self, around: Callable[[Any], Iterable[tuple[Any, bool]]], select_inserted: bool
    ) -> T | Self:
        what = "insert_before()/insert_after()"
        tree, marks = self._splice(lambda _path, old: around(old), what)
        if not select_inserted:
            return tree
        return self._fresh(tree).at_keypaths(marks)


def _walk(
    node: Any, path: KeyPath, trie: Trie, expand: _Expand, what: str, *, check: bool = True
) -> tuple[Any, list[KeyPath]]:
    """Rebuild ``node``, expanding the selected elements; also return the marked relative paths."""
    level = children(node)
    if level is None:
        raise _Moved
    keyed, treedef = level
    spliced = any(sub.here for sub in trie.next.values())
    if spliced and type(node) not in (list, tuple):
        at = next(k for k, sub in trie.next.items() if sub.here)
        raise SelectionError(
            f"{what}: the selected subtree at {jax.tree_util.keystr((*path, at))} is inside a "
            f"{type(node).__qualname__}, not a list or tuple; only elements of a plain list or "
            "tuple can be removed or have elements inserted next to them (use apply() or set() "
            "to replace other subtrees)"
        )
    new: list[Any] = []
    marks: list[KeyPath] = []
    reached = 0
    for key, child in keyed:
        sub = trie.next.get(key)
        if sub is None:
            new.append(child)
            continue
        reached += 1
        if sub.here:
            original, value = sub.value
            if check and not (type(child) is SelectionHole and child.path == original):
                raise _Moved
            for item, mark in expand(original, value):
                if mark:
                    marks.append((jax.tree_util.SequenceKey(len(new)),))
                new.append(item)
            continue
        rebuilt, inner = _walk(child, (*path, key), sub, expand, what, check=check)
        outer = jax.tree_util.SequenceKey(len(new)) if spliced else key
        marks.extend((outer, *m) for m in inner)
        new.append(rebuilt)
    if reached != len(trie.next):
        raise _Moved
    return (type(node)(new) if spliced else treedef.unflatten(new)), marks
