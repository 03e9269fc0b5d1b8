"""Tree paths of a manifest's arrays: how a format may name what it stores.

The manifest (see :mod:`jaxstruct.io._encode`) is a table of nodes; the
arrays table names arrays by opaque keys (``a0``, ``a1``, ...). A format that
names its datasets or tensors after the tree, as HDF5 and safetensors users
expect, asks :func:`array_paths` for each key's path: the steps from the root,
joined by dots (``params.layers.0.w``):

* a struct field or namedtuple field by its name, a list or tuple item by its
  index, a dict item by its key (``str``, ``int``, ``bool`` or ``None`` keys as
  text; any other key as ``<key N>``, N its position), a registered pytree's
  child by its index; a codec adds no step (its stored value stands in its
  place);
* in a step, ``%``, ``.`` and ``/`` are escaped as ``%25``, ``%2E`` and ``%2F``
  (so the dots between steps are the only dots, and a path never contains a
  slash, which HDF5 and file systems read as nesting);
* an array at the root has the path ``root``;
* paths are unique: where two would coincide (a dict with keys ``1`` and
  ``"1"``), the later one gets ``~`` and its array key appended.

:func:`walk` yields every node with its path, for formats (or tools) that need
more of the manifest than its arrays.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

__all__ = ["ManifestNode", "array_paths", "escape_step", "key_label", "walk"]

_SCALAR_KEYS = ("str", "int", "float", "bool", "none")
_SEQUENCES = ("list", "tuple", "set", "frozenset")
_ARRAYS = ("array", "jaxarray", "prngkey")


def escape_step(step: str) -> str:
    """Escape one path step: ``%`` as ``%25``, ``.`` as ``%2E``, ``/`` as ``%2F``.

    Example:
        >>> escape_step("lr.decay/2")
        'lr%2Edecay%2F2'
    """
    return step.replace("%", "%25").replace(".", "%2E").replace("/", "%2F")


def key_label(nodes: list[Any], index: Any) -> str | None:
    """The key of a dict item as it reads in Python (``'w'``, ``3``), or ``None`` if not simple."""
    if type(index) is not int or not 0 <= index < len(nodes):
        return None
    node = nodes[index]
    if not isinstance(node, list) or not node or node[0] not in _SCALAR_KEYS:
        return None
    if node[0] == "none":
        return "None"
    if len(node) != 2:
        return None
    return repr(node[1])


def _key_step(nodes: list[Any], index: Any, position: int) -> str:
    if type(index) is int and 0 <= index < len(nodes):
        node = nodes[index]
        if isinstance(node, list) and len(node) == 2 and node[0] in ("str", "int", "bool"):
            return escape_step(str(node[1]))
        if node == ["none"]:
            return "None"
    return f"<key {position}>"


class ManifestNode(NamedTuple):
    """One node of a manifest, as :func:`walk` yields it.

    Attributes:
        path: its tree path (``""`` for the root).
        tag: the node's tag (``"struct"``, ``"dict"``, ``"array"``, ...).
        node: the node itself (a JSON list; see the manifest layout in the io guide).
    """

    path: str
    tag: str
    node: list[Any]


def _manifest_of(manifest: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    top = json.loads(manifest) if isinstance(manifest, (bytes, str)) else manifest
    inner = top.get("manifest", top) if isinstance(top, Mapping) else None
    if not isinstance(inner, Mapping) or not isinstance(inner.get("nodes"), list):
        raise ValueError("not a jaxstruct manifest (expected 'manifest' with 'root' and 'nodes')")
    return dict(inner)


def _children(nodes: list[Any], node: list[Any]) -> list[tuple[str | None, Any]]:
    """``(step, child index)`` of a node; a ``None`` step adds nothing to the path."""
    tag = node[0]
    if tag in _SEQUENCES:
        return [(str(i), c) for i, c in enumerate(node[1])]
    if tag == "dict":
        items = node[1]
        return [
            (_key_step(nodes, items[i], i // 2), items[i + 1]) for i in range(0, len(items) - 1, 2)
        ]
    if tag == "namedtuple":
        return [(str(i), c) for i, c in enumerate(node[2])]
    if tag == "struct":
        return [(escape_step(str(name)), c) for name, c in node[3].items()]
    if tag == "pytree":
        return [(str(i), c) for i, c in enumerate(node[4])]
    if tag == "codec":
        return [(None, node[2])]
    return []


def walk(manifest: bytes | str | Mapping[str, Any]) -> Iterator[ManifestNode]:
    """Yield every node reachable from the root with its tree path, parents first.

    Args:
        manifest: the manifest bytes a format's ``write`` receives (or
            ``OpenedCheckpoint.manifest``), or that JSON already parsed.

    Raises:
        ValueError: it is not a well-formed manifest.

    Example:
        >>> import numpy as np
        >>> from jaxstruct.io import to_state_dict
        >>> state = to_state_dict({"w": np.zeros(2)})
        >>> [(n.path, n.tag) for n in walk(state)]
        [('', 'dict'), ('w', 'array')]
    """
    inner = _manifest_of(manifest)
    nodes, root = inner["nodes"], inner.get("root")
    if type(root) is not int or not 0 <= root < len(nodes):
        raise ValueError("the manifest's root is not a node index")
    stack: list[tuple[int, str]] = [(root, "")]
    seen = 0
    while stack:
        index, path = stack.pop()
        seen += 1
        if seen > len(nodes):
            raise ValueError("the manifest's nodes do not form a tree")
        node = nodes[index]
        if not isinstance(node, list) or not node or not isinstance(node[0], str):
            raise ValueError(f"node {index} is malformed")
        yield ManifestNode(path, node[0], node)
        try:
            kids = _children(nodes, node)
        except (IndexError, KeyError, TypeError, AttributeError):
            raise ValueError(f"node {index} is malformed") from None
        for step, child in reversed(kids):
            if type(child) is not int or not 0 <= child < index:
                raise ValueError(f"node {index} has an invalid child index")
            joined = path if step is None else (f"{path}.{step}" if path else step)
            stack.append((child, joined))


def array_paths(manifest: bytes | str | Mapping[str, Any]) -> dict[str, str]:
    """Return ``array key -> tree path`` for every array of a manifest (in tree order).

    A format's ``write`` gets the manifest bytes and the arrays by key; this
    names each array by where it sits (``params.layers.0.w``). On read, the
    same call on ``OpenedCheckpoint.manifest`` gives the same names back.

    Raises:
        ValueError: it is not a well-formed manifest.

    Example:
        >>> import numpy as np
        >>> from jaxstruct.io import to_state_dict
        >>> state = to_state_dict({"params": {"layers": [{"w": np.ones(1)}], "lr.x": np.ones(1)}})
        >>> array_paths(state)
        {'a0': 'params.layers.0.w', 'a1': 'params.lr%2Ex'}
    """
    out: dict[str, str] = {}
    taken: set[str] = set()
    for entry in walk(manifest):
        if entry.tag not in _ARRAYS or len(entry.node) < 2:
            continue
        key = entry.node[1]
        path = entry.path or "root"
        if path in taken:
            path = f"{path}~{escape_step(str(key))}"
        taken.add(path)
        out[str(key)] = path
    return out
