"""The ``arrays`` item's names: each array stored under its tree path, as plain orbax sees it.

The format saves the arrays as a nested dict keyed by their tree paths'
steps (``{"params": {"dense": {"kernel": ...}}}``), so that plain orbax
(``ocp.StandardCheckpointer().restore(path / "arrays")``) gives back the
arrays by name, and orbax names each stored array by its path
(``params.dense.kernel``). The storage item records ``array key -> path``;
checkpoints written before it hold a flat ``{a0: ..., a1: ...}`` tree and no
such record.

Paths come from :func:`jaxstruct.io.array_paths`, whose steps never contain
``.`` or ``/``. Names read from a file are checked before orbax sees them: a
name is dot-joined steps, none empty, ``.`` or ``..``, with no ``/``, ``\\``
or NUL (it names a directory of the checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxstruct.io import array_paths
from jaxstruct.registry import SerializationError

__all__ = ["check_names", "flatten", "nest", "tree_names"]

_BAD = frozenset("/\\\x00")
_MAX_NAME = 4096


def _steps_ok(name: object) -> bool:
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME or _BAD & set(name):
        return False
    return all(step not in ("", ".", "..") for step in name.split("."))


def tree_names(manifest: Mapping[str, Any], keys: Mapping[str, Any]) -> dict[str, str] | None:
    """``array key -> tree path`` for the stored ``keys``, or ``None`` when the paths cannot
    be nested (an empty step, or a path inside another's leaf): then keys name the arrays."""
    paths = array_paths(manifest)
    names = {key: paths.get(key, "") for key in keys}
    if not all(_steps_ok(name) for name in names.values()):
        return None
    taken = set(names.values())
    for name in names.values():
        parts = name.split(".")
        if any(".".join(parts[:i]) in taken for i in range(1, len(parts))):
            return None
    return names


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a.b": x}`` as ``{"a": {"b": x}}`` (names as :func:`tree_names` gives them)."""
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, last = name.split(".")
        node = tree
        for step in parents:
            node = node.setdefault(step, {})
        node[last] = value
    return tree


def flatten(tree: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The leaves of a nested mapping by dot-joined keys (the inverse of :func:`nest`)."""
    out: dict[str, Any] = {}
    stack: list[tuple[str, Mapping[str, Any]]] = [("", tree)]
    while stack:
        prefix, node = stack.pop()
        for key, value in node.items():
            if not isinstance(key, str):
                raise SerializationError(f"{where}: the arrays item has a key {key!r}")
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):
                stack.append((f"{name}.", value))
            else:
                out[name] = value
    return out


def check_names(found: object, where: str) -> dict[str, str] | None:
    """The storage item's ``names`` record, checked (``None`` when absent: keys name arrays)."""
    if found is None:
        return None
    if not isinstance(found, dict) or not all(isinstance(k, str) for k in found):
        raise SerializationError(f"{where}: the storage item's 'names' is not a mapping")
    bad = [key for key, name in found.items() if not _steps_ok(name)][:5]
    if bad:
        raise SerializationError(f"{where}: the storage item gives arrays {bad} malformed names")
    if len(set(found.values())) != len(found):
        raise SerializationError(f"{where}: the storage item gives two arrays the same name")
    return dict(found)
