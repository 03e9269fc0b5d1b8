"""Locating the nodes an accessor (``lambda t: t.a.b``) navigates to, without reading leaves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ._tree import KeyPath, SelectionError, children

__all__ = ["locate"]


class _Probe:
    """Stand-in for a leaf (or childless node) while locating an accessor's target."""

    __slots__ = ("path",)

    def __init__(self, path: KeyPath) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f"<node at {jax.tree_util.keystr(self.path) or 'root'}>"


def _probe(
    node: Any,
    path: KeyPath,
    table: dict[int, tuple[Any, KeyPath]],
    is_leaf: Callable[[Any], bool] | None,
) -> Any:
    level = None if is_leaf is not None and is_leaf(node) else children(node)
    if level is None:
        stand_in: Any = _Probe(path)
    else:
        keyed, treedef = level
        stand_in = treedef.unflatten(
            [_probe(child, (*path, key), table, is_leaf) for key, child in keyed]
        )
    # Keep the object itself in the table so its id cannot be reused meanwhile.
    table[id(stand_in)] = (stand_in, path)
    return stand_in


def locate(
    accessor: Callable[[Any], Any], tree: Any, is_leaf: Callable[[Any], bool] | None
) -> tuple[list[KeyPath], bool]:
    """Return the relative paths of the nodes ``accessor`` picks, and whether it picked several."""
    table: dict[int, tuple[Any, KeyPath]] = {}
    stand_in = _probe(tree, (), table, is_leaf)
    try:
        result = accessor(stand_in)
    except Exception as err:
        raise SelectionError(
            f"the accessor {getattr(accessor, '__qualname__', accessor)!r} failed on the tree's "
            f"structure ({type(err).__name__}: {err}); it may only navigate with attributes and "
            "indexing, not read leaf values"
        ) from err

    def path_of(obj: Any) -> KeyPath | None:
        entry = table.get(id(obj))
        return entry[1] if entry is not None and entry[0] is obj else None

    single = path_of(result)
    if single is not None:
        return [single], False
    if isinstance(result, tuple | list):
        paths = [path_of(item) for item in result]
        if all(p is not None for p in paths):
            unique = list(dict.fromkeys(p for p in paths if p is not None))
            for a in unique:
                for b in unique:
                    if a != b and b[: len(a)] == a:
                        raise SelectionError(
                            f"the accessor picked {jax.tree_util.keystr(b)} inside "
                            f"{jax.tree_util.keystr(a) or 'the root'}; selected nodes cannot "
                            "nest, pick one of them"
                        )
            return unique, True
    raise SelectionError(
        f"the accessor returned {type(result).__name__} {result!r}, which is not a pytree node "
        "of the tree; static and opaque struct fields are not pytree children (change them "
        "with .replace()), and the accessor must return the node itself, not a copy"
    )
