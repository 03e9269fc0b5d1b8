"""The tree path of every array of a manifest, as a tensor name (``params.layers.0.w``).

A stopgap: ``jaxstruct.io`` hands formats opaque array keys (``a0``, ``a1``,
...), and a public way to get each array's tree path is planned there. Until it
exists, this one module walks the manifest's node table (documented in
``jaxstruct.io._encode``); replace :func:`array_paths` by the io API when it
lands. The names are only used on write: a file records its own
``key -> tensor name`` table, so files stay readable if this rule changes.

Steps are struct field names, dict keys (``str``/``int``/``bool``/``None``
keys as their text; other keys by position), list/tuple and namedtuple
positions, and child positions of other pytree nodes; each is escaped with
:func:`jaxstruct.io.join_path` (``.`` -> ``%2E``, ``/`` -> ``%2F``,
``%`` -> ``%25``). The walk is iterative: depth costs no recursion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxstruct.io import join_path

__all__ = ["array_paths"]

_SCALAR_KEYS = frozenset({"str", "int", "bool", "none"})
_SEQUENCES = frozenset({"list", "tuple", "set", "frozenset"})


def _key_text(node: Any, position: int) -> object:
    if isinstance(node, list) and node and node[0] in _SCALAR_KEYS:
        return "None" if node[0] == "none" else node[1]
    return f"<key {position}>"


def _children(node: list[Any], nodes: Sequence[Any]) -> list[tuple[object, int]]:
    """``(step, child index)`` for the children of one node that may hold arrays."""
    tag = node[0]
    if tag in _SEQUENCES:
        return list(enumerate(node[1]))
    if tag == "dict":
        flat = node[1]
        pairs = zip(flat[0::2], flat[1::2], strict=True)
        return [(_key_text(nodes[k], i), v) for i, (k, v) in enumerate(pairs)]
    if tag == "namedtuple":
        return list(enumerate(node[2]))
    if tag == "struct":
        return list(node[3].items())
    if tag == "pytree":  # its payload (or aux data) first, then its children
        return [("<payload>", node[3]), *enumerate(node[4])]
    if tag == "codec":
        return [(f"<{node[1]}>", node[2])]
    return []


def array_paths(manifest: dict[str, Any]) -> dict[str, str]:
    """Map each array key of ``manifest`` (``{"root": i, "nodes": [...]}``) to its tree path.

    Names are unique: if two paths ever escape to the same text (a dict with
    the keys ``1`` and ``"1"``), the later array gets its key appended
    (``x.1~a7``).
    """
    nodes = manifest["nodes"]
    out: dict[str, str] = {}
    taken: set[str] = set()
    stack: list[tuple[int, tuple[object, ...]]] = [(manifest["root"], ())]
    while stack:
        index, steps = stack.pop()
        node = nodes[index]
        if node[0] in ("array", "jaxarray", "prngkey"):
            name = join_path(steps) or "_"
            if name in taken:
                name = f"{name}~{node[1]}"
            taken.add(name)
            out[node[1]] = name
            continue
        for step, child in reversed(_children(node, nodes)):
            stack.append((child, (*steps, step)))
    return out
