"""Holes and the tree walks every selector shares: split a tree at holes, fill holes back.

Holes are found by key path, never by type, so a tree that itself contains
``SelectionHole`` or ``Selection`` objects can be selected safely. The one
exception is a remainder edited so that a hole moved (see :func:`fill`): then,
and only then, the moved holes are looked up by type and recorded path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import jax
from jaxstruct.registry import StructError

from .._fields import field
from .._struct import Struct

__all__ = [
    "KeyPath",
    "SelectionError",
    "SelectionHole",
    "T",
    "Trie",
    "children",
    "fill",
    "is_leaf",
    "split",
    "split_at",
]

T = TypeVar("T")
KeyPath = tuple[Any, ...]

SELECT, DESCEND, SKIP = 0, 1, 2
NO_VALUE: Any = object()


class SelectionError(StructError, ValueError):
    """A selection cannot be built, queried or rebuilt as asked."""


class SelectionHole(Struct):
    """A childless placeholder standing where a selected subtree was taken out of the tree.

    It has no pytree children (its ``path`` is static), so JAX sees the
    selected part as removed. You meet holes only when looking at
    ``Selection.remainder``; :func:`select` and its methods create them.

    Attributes:
        path: the key path of the selected subtree, from the root of the tree.

    Example:
        >>> import jax
        >>> import jaxstruct.core as js
        >>> sel = js.select({"a": 1, "b": 2}).at_keypaths([(jax.tree_util.DictKey("a"),)])
        >>> sel.remainder["a"]
        SelectionHole(path=(DictKey(key='a'),))
        >>> jax.tree_util.tree_leaves(sel.remainder)
        [2]
    """

    path: tuple[Any, ...] = field(static=True)


def children(node: Any) -> tuple[list[tuple[Any, Any]], Any] | None:
    """Flatten exactly one level: ``([(key, child), ...], treedef)``, or ``None`` if childless."""
    keyed, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if treedef.num_nodes == 1:
        return None
    return [(path[0], child) for path, child in keyed], treedef


def is_leaf(node: Any) -> bool:
    """Whether ``node`` is a JAX leaf (not a container, not ``None``, not an empty node)."""
    treedef = jax.tree_util.tree_structure(node)
    return treedef.num_leaves == 1 and treedef.num_nodes == 1


def split(
    node: Any,
    path: KeyPath,
    rel: KeyPath,
    decide: Callable[[KeyPath, Any], int],
    found: list[tuple[KeyPath, Any]],
    *,
    innermost: bool = False,
    bottom: Callable[[Any], bool] | None = None,
) -> Any:
    """Return ``node`` with the chosen subtrees replaced by holes, appending them to ``found``.

    ``bottom`` selects childless nodes it accepts (leaves, or every childless node).
    """
    if not innermost:
        verdict = decide(rel, node)
        if verdict == SELECT:
            found.append((path, node))
            return SelectionHole(path)
        if verdict == SKIP:
            return node
    level = children(node)
    if level is None:
        if (bottom is not None and bottom(node)) or (innermost and decide(rel, node) == SELECT):
            found.append((path, node))
            return SelectionHole(path)
        return node
    keyed, treedef = level
    before = len(found)
    new = [
        split(child, (*path, key), (*rel, key), decide, found, innermost=innermost, bottom=bottom)
        for key, child in keyed
    ]
    if len(found) > before:
        return treedef.unflatten(new)
    if innermost and decide(rel, node) == SELECT:
        found.append((path, node))
        return SelectionHole(path)
    return node


class Trie:
    """Key paths as a tree of dicts, so a walk only descends where a path continues."""

    __slots__ = ("here", "next", "value")

    def __init__(self) -> None:
        self.next: dict[Any, Trie] = {}
        self.here = False
        self.value: Any = NO_VALUE

    @classmethod
    def build(cls, items: Iterable[tuple[KeyPath, Any]]) -> Trie:
        root = cls()
        for path, value in items:
            t = root
            for key in path:
                t = t.next.setdefault(key, cls())
            t.here = True
            t.value = value
        return root


def rebuild(node: Any, path: KeyPath, trie: Trie, at: Callable[[Any, KeyPath, Trie], Any]) -> Any:
    """Rebuild ``node``, replacing each node at a path that ends in ``trie`` by ``at(...)``."""
    if trie.here:
        return at(node, path, trie)
    level = children(node)
    if level is None:
        return node
    keyed, treedef = level
    new = []
    for key, child in keyed:
        sub = trie.next.get(key)
        new.append(child if sub is None else rebuild(child, (*path, key), sub, at))
    return treedef.unflatten(new)


def fill(remainder: Any, items: Sequence[tuple[KeyPath, Any]]) -> Any:
    """Put each value of ``items`` in place of the hole recorded for its path in ``remainder``.

    A remainder that was edited through an outer selection may hold a hole at
    another place than its recorded path (``apply(lambda d: [d])`` on a part of
    it): such holes are found by type and path and filled where they now are,
    so no hole is ever left in the result. A hole that is gone, or that
    appears twice, is a :class:`SelectionError`.
    """
    filled = 0

    def at(node: Any, _path: KeyPath, t: Trie) -> Any:
        nonlocal filled
        path, value = t.value
        # Holes normally carry the very tuple the selection stores: ``is`` first.
        if type(node) is SelectionHole and (node.path is path or node.path == path):
            filled += 1
            return value
        return node

    out = rebuild(remainder, (), Trie.build((p, (p, v)) for p, v in items), at)
    if filled == len(items):
        return out
    moved = relocate(remainder, [p for p, _ in items])
    return rebuild(
        remainder,
        (),
        Trie.build((moved[p], v) for p, v in items),
        lambda _node, _path, t: t.value,
    )


def relocate(remainder: Any, paths: Sequence[KeyPath]) -> dict[KeyPath, KeyPath]:
    """Return where the hole recorded for each of ``paths`` now sits in ``remainder``.

    Raises:
        SelectionError: a hole is missing, or found more than once.
    """
    wanted = set(paths)
    where: dict[KeyPath, list[KeyPath]] = {}

    def walk(node: Any, at: KeyPath) -> None:
        if type(node) is SelectionHole:
            if node.path in wanted:
                where.setdefault(node.path, []).append(at)
            return
        level = children(node)
        if level is not None:
            for key, child in level[0]:
                walk(child, (*at, key))

    walk(remainder, ())
    for path in paths:
        spots = where.get(path, [])
        if len(spots) != 1:
            what = "is gone from" if not spots else f"appears {len(spots)} times in"
            raise SelectionError(
                f"the hole of the selected subtree at {jax.tree_util.keystr(path) or 'the root'} "
                f"{what} the selection's remainder (the remainder was edited), so the selected "
                "value has no single place to go back to; keep each "
                "SelectionHole of the remainder exactly once when editing it, or call "
                "deselect() first and select again"
            )
    return {path: where[path][0] for path in paths}


def split_at(node: Any, path: KeyPath, trie: Trie, found: list[tuple[KeyPath, Any]]) -> Any:
    """Like :func:`split` for the exact paths in ``trie`` (whose nodes may be childless)."""

    def hole(node: Any, path: KeyPath, _trie: Trie) -> Any:
        found.append((path, node))
        return SelectionHole(path)

    return rebuild(node, path, trie, hole)


def child(node: Any, key: Any) -> Any:
    """Return the child of ``node`` at ``key``."""
    if isinstance(key, jax.tree_util.GetAttrKey) and isinstance(node, Struct):
        return getattr(node, key.name)
    # Plain containers are indexed directly: flattening a 1,000-element list
    # once per selected path made rebuilding quadratic.
    if type(node) is dict and isinstance(key, jax.tree_util.DictKey) and key.key in node:
        return node[key.key]
    sequence = type(node) in (list, tuple) and isinstance(key, jax.tree_util.SequenceKey)
    if sequence and 0 <= key.idx < len(node):
        return node[key.idx]
    level = children(node)
    if level is not None:
        for k, value in level[0]:
            if k == key:
                return value
    raise SelectionError(f"no child at key {key!r} in {type(node).__qualname__}")


def reconvert(remainder: Any, path: KeyPath, value: Any) -> Any:
    """Run the converter of the struct field at ``path``, if it is one (see the README)."""
    if not path:
        return value
    key = path[-1]
    if not isinstance(key, jax.tree_util.GetAttrKey):
        return value
    parent = remainder
    for k in path[:-1]:
        parent = child(parent, k)
    layout = getattr(type(parent), "__struct_layout__", None)
    if layout is None:
        return value
    spec = layout.by_name.get(key.name)
    if spec is None or spec.converter is None:
        return value
    return layout.convert(parent, spec, value)
