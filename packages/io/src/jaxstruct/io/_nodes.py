"""The manifest's node kinds: one table of their tags and layouts, the children each holds,
and how a path names them.

A manifest stores a value as a post-order list of nodes, each a JSON list whose
first item is its tag (the layout is in the io guide). Encoding writes these
nodes; decoding, :func:`jaxstruct.io.walk`, ``inspect`` and restore targets read
them. Every one of them takes the tags from here (:data:`KINDS`; no other module
spells a tag), and learns here which children a node has (:func:`children`),
which scalars may be dict keys and their values (:func:`key_value`), and how a
path names each child (:func:`error_step`, :func:`tree_step`).
"""

from __future__ import annotations

import math
import pathlib
import struct
from typing import Any, NamedTuple

# The tags, one constant each (the words stored in manifests).
NONE, BOOL, INT, FLOAT, COMPLEX, STR, BYTES = (
    "none",
    "bool",
    "int",
    "float",
    "complex",
    "str",
    "bytes",
)
PATH, NPSCALAR = "path", "npscalar"
LIST, TUPLE, SET, FROZENSET, DICT = "list", "tuple", "set", "frozenset", "dict"
NAMEDTUPLE, ENUM, STRUCT, PYTREE, CODEC, MAPPING = (
    "namedtuple",
    "enum",
    "struct",
    "pytree",
    "codec",
    "mapping",
)
ARRAY, JAXARRAY, PRNGKEY = "array", "jaxarray", "prngkey"
CALLABLE, CLASS, SCALARTYPE = "callable", "class", "scalartype"


class Kind(NamedTuple):
    """One kind of node, as :data:`KINDS` lists it.

    Attributes:
        tag: the node's first item.
        layout: how the node is laid out (what the io guide's table shows).
        group: ``"scalar"``, ``"sequence"``, ``"container"``, ``"array"`` (holds one
            array of the arrays table), ``"class"`` (names a class) or ``"reference"``
            (names a function or a type, never called).
        key: a scalar that may be a dict key, shown in messages as Python writes it;
            :func:`key_value` gives its value.
        python: the Python type a scalar or sequence node rebuilds.
    """

    tag: str
    layout: str
    group: str
    key: bool = False
    python: type | None = None


#: Every node kind, by tag: the handlers of decoding and the descriptions of ``inspect``
#: cover exactly these (a test checks it).
KINDS: dict[str, Kind] = {
    kind.tag: kind
    for kind in (
        Kind(NONE, '["none"]', "scalar", key=True, python=type(None)),
        Kind(BOOL, '["bool", b]', "scalar", key=True, python=bool),
        Kind(INT, '["int", n] (beyond 2**53: the hex of n)', "scalar", key=True, python=int),
        Kind(FLOAT, '["float", x] (not finite: the hex of its bits)', "scalar", True, float),
        Kind(COMPLEX, '["complex", real, imaginary]', "scalar", python=complex),
        Kind(STR, '["str", s]', "scalar", key=True, python=str),
        Kind(BYTES, '["bytes", base64]', "scalar", python=bytes),
        Kind(PATH, '["path", class name, s]', "scalar"),
        Kind(NPSCALAR, '["npscalar", dtype name, hex of its bytes]', "scalar"),
        Kind(LIST, '["list", [items]]', "sequence", python=list),
        Kind(TUPLE, '["tuple", [items]]', "sequence", python=tuple),
        Kind(SET, '["set", [items]]', "sequence", python=set),
        Kind(FROZENSET, '["frozenset", [items]]', "sequence", python=frozenset),
        Kind(DICT, '["dict", [key, value, key, value, ...]]', "container"),
        Kind(NAMEDTUPLE, '["namedtuple", class, [items]]', "class"),
        Kind(ENUM, '["enum", class, member name]', "class"),
        Kind(STRUCT, '["struct", class, version, {field: child}, field kinds]', "class"),
        Kind(PYTREE, '["pytree", class, mode, payload, [children], names?]', "class"),
        Kind(CODEC, '["codec", codec name, child]', "container"),
        Kind(MAPPING, '["mapping", class, child]', "container"),
        Kind(ARRAY, '["array", key]', "array"),
        Kind(JAXARRAY, '["jaxarray", key, "weak"?]', "array"),
        Kind(PRNGKEY, '["prngkey", key, implementation]', "array"),
        Kind(CALLABLE, '["callable", "module:qualname"]', "reference"),
        Kind(CLASS, '["class", class]', "reference"),
        Kind(SCALARTYPE, '["scalartype", library, dtype name]', "reference"),
    )
}
#: Every tag.
TAGS = frozenset(KINDS)
#: The sequence tags and the type each rebuilds.
SEQUENCES: dict[str, type] = {
    k.tag: k.python for k in KINDS.values() if k.group == "sequence" and k.python is not None
}
#: Nodes holding one array of the arrays table (``[tag, key, ...]``).
ARRAY_TAGS = frozenset(k.tag for k in KINDS.values() if k.group == "array")
#: Nodes naming a class (``[tag, "module:QualName", ...]``).
CLASS_TAGS = frozenset(k.tag for k in KINDS.values() if k.group == "class")
#: Scalar nodes that may be a dict key shown as Python writes it (``'lr'``, ``3``).
KEY_TAGS = frozenset(k.tag for k in KINDS.values() if k.key)
#: The path classes stored as ``["path", name, s]``.
PATH_TYPES = {
    cls.__name__: cls
    for cls in (
        pathlib.PurePosixPath,
        pathlib.PureWindowsPath,
        pathlib.PosixPath,
        pathlib.WindowsPath,
    )
}

#: :func:`key_value` of a node that is not a scalar key.
NOT_A_KEY: Any = object()


def key_value(node: object) -> Any:
    """The Python value of a dict key stored as a scalar node of :data:`KEY_TAGS`
    (``["int", "0x..."]`` is the int), else :data:`NOT_A_KEY`."""
    if not isinstance(node, list) or not node or type(node[0]) is not str:
        return NOT_A_KEY
    if node[0] not in KEY_TAGS:
        return NOT_A_KEY
    if node == [NONE]:
        return None
    if len(node) != 2:
        return NOT_A_KEY
    tag, value = node
    python = KINDS[tag].python
    if type(value) is python or (tag == FLOAT and type(value) is int):
        return value
    if isinstance(value, str) and tag == INT:
        try:
            return int(value, 16)
        except ValueError:
            return NOT_A_KEY
    if isinstance(value, str) and tag == FLOAT and len(value) == 16:
        try:
            found = struct.unpack(">d", bytes.fromhex(value))[0]
        except ValueError:
            return NOT_A_KEY
        return found if not math.isfinite(found) else NOT_A_KEY
    return NOT_A_KEY


class MalformedNode(ValueError):
    """A node whose children are not laid out as its tag says."""


class Child(NamedTuple):
    """One child of a node, as :func:`children` gives it.

    Attributes:
        index: the child's node index as stored (callers check it).
        role: ``"item"`` (of a sequence or namedtuple), ``"key"`` / ``"value"`` (of a
            dict pair), ``"field"`` (of a struct), ``"payload"`` / ``"child"`` (of a
            pytree node), or ``"data"`` (what a codec or a mapping node holds).
        position: its position among the children of its role (a dict pair's number).
        name: a field's name, a pytree child's key-path name (``None`` when it has
            none), the codec's name, or ``"items"`` for a mapping; else ``None``.
        key: for a dict value, the index of its key's node.
    """

    index: Any
    role: str
    position: int
    name: str | None = None
    key: Any = None


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise MalformedNode(f"expected a list of child indices, got {type(value).__name__}")
    return value


def child_names(node: list[Any]) -> list[str] | None:
    """The names a JAX pytree node (``["pytree", ref, "j", ...]``) stores for its
    children (JAX's key-path steps), or ``None`` when it stores none or malformed ones."""
    if len(node) != 6 or node[2] != "j":  # "j": registered with JAX only
        return None
    names, kids = node[5], node[4]
    ok = isinstance(names, list) and isinstance(kids, list) and len(names) == len(kids)
    return names if ok and all(type(name) is str for name in names) else None


def children(node: list[Any]) -> list[Child]:
    """The children of ``node`` (a list starting with its tag), in stored order.

    Raises:
        MalformedNode: the node is too short, or a child list is not a list (a field
            table not a dict) where its tag needs one.
    """
    tag = node[0]
    if not isinstance(tag, str):
        return []  # not a tag at all: a node of no known kind has no children
    try:
        if tag in SEQUENCES or tag == NAMEDTUPLE:
            items = _list(node[2] if tag == NAMEDTUPLE else node[1])
            return [Child(c, "item", i) for i, c in enumerate(items)]
        if tag == DICT:
            items = _list(node[1])
            out: list[Child] = []
            for i in range(0, len(items) - 1, 2):
                out.append(Child(items[i], "key", i // 2))
                out.append(Child(items[i + 1], "value", i // 2, key=items[i]))
            return out
        if tag == STRUCT:
            fields = node[3]
            if not isinstance(fields, dict):
                raise MalformedNode("a struct's fields must be an object")
            return [Child(c, "field", i, str(n)) for i, (n, c) in enumerate(fields.items())]
        if tag == PYTREE:
            kids = _list(node[4])
            names = child_names(node)
            return [Child(node[3], "payload", 0)] + [
                Child(c, "child", i, names[i] if names else None) for i, c in enumerate(kids)
            ]
        if tag == CODEC:
            return [Child(node[2], "data", 0, str(node[1]))]
        if tag == MAPPING:
            return [Child(node[2], "data", 0, "items")]
    except IndexError:
        raise MalformedNode(f"a {tag} node is too short") from None
    return []


def key_label(nodes: list[Any], index: Any) -> str | None:
    """The key of a dict item as it reads in Python (``'w'``, ``3``), or ``None`` if not simple."""
    if type(index) is not int or not 0 <= index < len(nodes):
        return None
    value = key_value(nodes[index])
    return None if value is NOT_A_KEY else repr(value)


def error_step(nodes: list[Any], child: Child) -> str:
    """How an error message names ``child`` after its parent's path: ``[0]``, ``['lr']``,
    ``.<key 'lr'>``, ``.w``, ``.<payload>``, ``.<child 0>``, ``.<codec name>``."""
    role, i = child.role, child.position
    if role == "item":
        return f"[{i}]"
    if role == "key":
        return f".<key {key_label(nodes, child.index) or i}>"
    if role == "value":
        return f"[{key_label(nodes, child.key) or f'<key {i}>'}]"
    if role == "field":
        return f".{child.name}"
    if role == "payload":
        return ".<payload>"
    if role == "child":
        return f".{child.name}" if child.name is not None else f".<child {i}>"
    return f".<{child.name}>"


#: How a tree path writes an empty step (the dict key ``""``): a ``%`` that no escape
#: follows, which no other step can be (a ``%`` inside a step is ``%25``).
EMPTY_STEP = "%"


def escape_step(step: str) -> str:
    """Escape one path step: ``%`` as ``%25``, ``.`` as ``%2E``, ``/`` as ``%2F``, and the
    empty step as ``%``, so that joining steps with ``.`` loses none of them."""
    if not step:
        return EMPTY_STEP
    return step.replace("%", "%25").replace(".", "%2E").replace("/", "%2F")


#: The roles of the children on a tree path: a dict's keys and a pytree node's payload
#: (its static data) are not.
TREE_ROLES = frozenset({"item", "value", "field", "child", "data"})


def tree_step(nodes: list[Any], child: Child) -> str | None:
    """How a tree path (``params.layers.0.w``) names ``child``, one of :data:`TREE_ROLES`:
    ``None`` adds no step (what a codec or mapping holds)."""
    role, i = child.role, child.position
    if role == "item":
        return str(i)
    if role == "value":
        key = child.key
        if type(key) is int and 0 <= key < len(nodes):
            node = nodes[key]
            if isinstance(node, list) and len(node) == 2 and node[0] in (STR, INT, BOOL):
                return escape_step(str(node[1]))
            if node == [NONE]:
                return "None"
        return f"<key {i}>"
    if role in ("field", "child"):
        return escape_step(child.name if child.name is not None else str(i))
    return None
