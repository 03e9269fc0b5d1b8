"""Describing a checkpoint without loading its arrays or importing anything."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
from jaxstruct.registry import SerializationError

from ._contract import call_format, expected_checks, read_checked, source_of
from ._decode import struct_kinds_ok
from ._formats import CHECKSUMS_NOT_STATED, ArraySpec, Format, OpenedCheckpoint, local_or_url
from ._load import open_any
from ._nodes import (
    ARRAY_TAGS,
    BOOL,
    BYTES,
    CALLABLE,
    CLASS,
    CODEC,
    COMPLEX,
    DICT,
    ENUM,
    FLOAT,
    INT,
    JAXARRAY,
    MAPPING,
    NAMEDTUPLE,
    NONE,
    NPSCALAR,
    PATH,
    PRNGKEY,
    PYTREE,
    SCALARTYPE,
    SEQUENCES,
    STR,
    STRUCT,
    children,
    key_label,
)
from ._schema import BY_FORMAT, check_arrays_table, clip, limits_from_kwargs

_MAX_LINES = 20_000
_MAX_INDENT = 48


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What :func:`inspect` reports about a checkpoint.

    Attributes:
        path: the checkpoint (a URL stays a string).
        container: its format name (``"directory"``, ``"zip"``, or a plugin's).
        version: the format version; ``None`` for a checkpoint without a jaxstruct
            manifest (another tool wrote it).
        arrays: ``key -> (dtype name, shape, bytes)``; for a checkpoint without a
            manifest, keyed by the stored tensors' names.
        total_bytes: decoded size of all arrays.
        tree: the stored value as an indented tree, one node per line; dict
            items are shown under their keys (``['w']: ...``). Without a manifest:
            the stored tensors, one per line under their names.
        tree_json: the same tree as nested ``{"edge", "label", "children"}`` dicts.
        checksums: what protects the stored bytes, as the format states it
            (``"CRC-32 of every member, the manifest's included"``; ``"none:
            written by another tool"``; ``"not stated by the format"`` for a format
            that does not say).
        has_manifest: whether the checkpoint holds a jaxstruct manifest (classes,
            fields); ``False`` for a file another tool wrote.
        note: for a checkpoint without a manifest, how to load it; otherwise ``""``.
    """

    path: Path | str
    container: str
    version: int | None
    arrays: dict[str, tuple[str, tuple[int, ...], int]]
    total_bytes: int
    tree: str
    tree_json: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    checksums: str = CHECKSUMS_NOT_STATED
    has_manifest: bool = True
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """The same information as a JSON-ready dict (the tree nested, one dict per node)."""
        return {
            "path": str(self.path),
            "container": self.container,
            "version": self.version,
            "has_manifest": self.has_manifest,
            "checksums": self.checksums,
            **({"note": self.note} if self.note else {}),
            "total_bytes": self.total_bytes,
            "arrays": {
                key: {"dtype": dtype, "shape": list(shape), "nbytes": nbytes}
                for key, (dtype, shape, nbytes) in self.arrays.items()
            },
            "tree": self.tree_json,
        }

    def __str__(self) -> str:
        counts = f"{len(self.arrays)} arrays, {_size(self.total_bytes)}"
        if self.has_manifest:
            head = f"{self.container} checkpoint, format version {self.version}, {counts}"
        else:
            head = f"{self.container} checkpoint without a jaxstruct manifest, {counts}"
        lines = [f"{self.path} ({head})", f"checksums: {self.checksums}"]
        if self.note:
            lines.append(f"note: {self.note}")
        return "\n".join([*lines, self.tree])


def _piece_size(n: int) -> str:
    """A piece size (a power of two, 4 KiB to 1 GiB) in words: ``1 MiB``."""
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _size(n: float) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GiB"


_KINDS = {"n": "node", "s": "static", "o": "opaque"}


def _edges(node: list[Any], nodes: list[Any]) -> list[tuple[str, Any]]:
    """The ``(edge label, child index)`` pairs of ``node``, as the tree shows them."""
    kids = children(node)
    kinds = None
    if node[0] == STRUCT and len(node) == 5 and struct_kinds_ok(node[4], len(kids)):
        kinds = node[4]  # files written before field kinds were recorded show none
    edges: list[tuple[str, Any]] = []
    for kid in kids:
        role = kid.role
        if role == "item":
            edges.append((f"[{kid.position}]", kid.index))
        elif role == "key":
            if key_label(nodes, kid.index) is None:  # a tuple, a struct...: show the key node
                edges.append(("<key>", kid.index))
        elif role == "value":
            key = key_label(nodes, kid.key)
            edges.append(("<value>" if key is None else f"[{clip(key, 40)}]", kid.index))
        elif role == "field":
            mark = f" [{_KINDS[kinds[kid.position]]}]" if kinds is not None else ""
            edges.append((f".{kid.name}{mark}", kid.index))
        elif role == "payload":  # registered with JAX only: its payload is its static data
            edges.append(("<static>" if node[2] == "j" else "<payload>", kid.index))
        elif role == "child":
            edges.append(
                (f".{kid.name}" if kid.name is not None else f"<child {kid.position}>", kid.index)
            )
        else:
            edges.append(("<data>" if node[0] == CODEC else f"<{kid.name}>", kid.index))
    return edges


def _describe(
    node: Any, arrays: dict[str, tuple[str, tuple[int, ...], int]], nodes: list[Any]
) -> tuple[str, list[tuple[str, Any]]]:
    """Return a label for ``node`` and its ``(edge label, child index)`` pairs."""
    tag = node[0]
    if not isinstance(tag, str):
        raise SerializationError(f"unknown node tag {tag!r}")
    edges = _edges(node, nodes)
    if tag in SEQUENCES:
        return f"{tag} ({len(node[1])} items)", edges
    if tag == DICT:
        return f"dict ({len(node[1]) // 2} items)", edges
    if tag == NAMEDTUPLE:
        return f"namedtuple {node[1]}", edges
    if tag == STRUCT:
        version = f", schema version {node[2]}" if node[2] else ""
        return f"{node[1]} (struct{version})", edges
    if tag == PYTREE:
        foreign = node[2] == "j"
        return f"{node[1]} ({'JAX' if foreign else 'registered'} pytree)", edges
    if tag == CALLABLE:
        return f"function {node[1]} (code, not stored: a load takes it from target=)", []
    if tag == CODEC:
        return f"<codec {node[1]!r}>", edges
    if tag == MAPPING:
        return f"mapping {node[1]}", edges
    if tag == CLASS:
        return f"class {node[1]}", []
    if tag == SCALARTYPE:
        return f"scalar type {node[1]}.{node[2]}", []
    if tag in ARRAY_TAGS:
        if len(node) < 2 or not isinstance(node[1], str) or node[1] not in arrays:
            raise SerializationError(f"array node names {clip(repr(node[1:2]))}, not in the table")
        dtype, shape, nbytes = arrays[node[1]]
        data = f"{dtype}{list(shape)} {_size(nbytes)} ({node[1]})"
        if tag == PRNGKEY:
            impl = node[2] if len(node) == 3 else "?"
            return f"PRNG key array ({clip(str(impl), 40)}), key data {data}", []
        kind = "jax array" if tag == JAXARRAY else "array"
        return f"{'weakly typed ' if len(node) == 3 else ''}{kind} {data}", []
    if tag == ENUM:
        return f"enum {node[1]}.{node[2]}", []
    if tag == NPSCALAR:
        return f"numpy scalar {node[1]} 0x{node[2]}", []
    if tag == NONE:
        return "None", []
    if tag == PATH:
        return f"{node[1]}({node[2]!r})", []
    if tag == BYTES:
        return f"bytes (base64 {clip(repr(node[1]), 40)})", []
    if tag in (BOOL, INT, FLOAT, STR, COMPLEX):
        return f"{tag} {clip(repr(node[1:]) if tag == COMPLEX else repr(node[1]))}", []
    raise SerializationError(f"unknown node tag {tag!r}")


def _render(
    nodes: list[Any], root: int, arrays: dict[str, tuple[str, tuple[int, ...], int]]
) -> tuple[str, dict[str, Any]]:
    """Return the tree as indented text and as nested ``{"edge", "label", "children"}`` dicts."""
    lines: list[str] = []
    top: dict[str, Any] = {"edge": "", "label": "", "children": []}
    stack: list[tuple[int, str, int, list[Any]]] = [(root, "", 0, top["children"])]
    while stack:
        if len(lines) >= _MAX_LINES:
            lines.append(f"... ({len(nodes)} nodes in all; output truncated)")
            break
        index, edge, depth, siblings = stack.pop()
        if type(index) is not int or not 0 <= index < len(nodes):
            raise SerializationError(f"child index {index!r} is out of range")
        node = nodes[index]
        if not isinstance(node, list) or not node:
            raise SerializationError(f"node {index} is not a non-empty list")
        label, kids = _describe(node, arrays, nodes)
        indent = "  " * min(depth, _MAX_INDENT) + ("" if depth <= _MAX_INDENT else f"[{depth}] ")
        lines.append(f"{indent}{edge + ': ' if edge else ''}{label}")
        entry: dict[str, Any] = {"edge": edge, "label": label, "children": []}
        siblings.append(entry)
        for kid_edge, kid in reversed(kids):
            if type(kid) is not int or not 0 <= kid < index:
                raise SerializationError(f"child index {kid!r} of node {index} is invalid")
            stack.append((kid, kid_edge, depth + 1, entry["children"]))
    return "\n".join(lines), top["children"][0] if top["children"] else {}


def inspect(path: str | os.PathLike[str], **limits: int) -> CheckpointInfo:
    """Describe a checkpoint: classes, fields, shapes, dtypes, sizes, format version and
    what protects its bytes.

    Only the manifest is read: no array data, no imports, no class lookups. A file
    another tool wrote (a ``.safetensors`` file of the Hugging Face hub, a plain
    orbax checkpoint) has no manifest: its stored tensors are listed by name,
    with a note saying how to load it.

    Args:
        path: a checkpoint directory or file, or a URL (for formats that accept
            remote paths), as :func:`load` takes it.
        **limits: ``max_manifest_bytes=``, ``max_nodes=`` and ``max_array_bytes=`` as for
            :func:`load`.

    Returns:
        A :class:`CheckpointInfo`; ``str()`` of it is the report the
        ``jaxstruct inspect`` command prints.

    Raises:
        FileNotFoundError: nothing exists at ``path``.
        SerializationError: the checkpoint or its manifest is malformed.

    Example:
        >>> import tempfile, numpy as np
        >>> from jaxstruct.io import export
        >>> target = Path(tempfile.mkdtemp()) / "ckpt"
        >>> _ = export({"w": np.zeros((2, 3), np.float32)}, target)
        >>> info = inspect(target)
        >>> print(info.tree)
        dict (1 items)
          ['w']: array <f4[2, 3] 24 B (a0)
        >>> info.checksums
        "CRC-32 of every member, the manifest's included"
    """
    lim = limits_from_kwargs("inspect", limits)
    target = local_or_url(path, "inspect")
    where = repr(str(target))
    fmt, opened, top = open_any(target, lim)
    try:
        checksums = _checksums_of(opened, top)
        if top is None:
            return _without_manifest(target, fmt, opened, checksums, where)
    finally:
        opened.close()
    table = check_arrays_table(top["arrays"], where, lim)
    arrays = {k: (top["arrays"][k]["dtype"], shape, n) for k, (_, shape, n) in table.items()}
    try:
        nodes, root = top["manifest"]["nodes"], top["manifest"]["root"]
        if not isinstance(nodes, list) or type(root) is not int or root != len(nodes) - 1:
            raise SerializationError("the manifest root must be the index of the last node")
        tree, tree_json = _render(nodes, root, arrays)
    except SerializationError as err:
        raise SerializationError(f"{where}: {err}") from None
    except Exception as err:
        raise SerializationError(
            f"{where}: malformed manifest ({type(err).__name__}: {err})"
        ) from None
    return CheckpointInfo(
        path=target,
        container=fmt.name,
        version=top["version"],
        arrays=arrays,
        total_bytes=sum(n for _, _, n in arrays.values()),
        tree=tree,
        tree_json=tree_json,
        checksums=checksums,
    )


def _checksums_of(opened: OpenedCheckpoint, top: dict[str, Any] | None) -> str:
    """What protects the stored bytes: jaxstruct's CRC-32s of a plugin format's arrays
    where the manifest records them (and what the format states of its own, if anything),
    else the opened checkpoint's ``checksum_scheme`` (a format that sets none, or not a
    string, does not state it)."""
    stated = getattr(opened, "checksum_scheme", CHECKSUMS_NOT_STATED)
    stated = clip(stated, 200) if isinstance(stated, str) and stated else CHECKSUMS_NOT_STATED
    section = None if top is None else top.get("checksums")
    if not (isinstance(section, dict) and section.get("by") == "jaxstruct"):
        return stated
    ours = (
        f"CRC-32 of every {_piece_size(section['piece'])} piece of every array and of the "
        "manifest, kept by jaxstruct"
    )
    return ours if stated == CHECKSUMS_NOT_STATED else f"{ours}; the format's own: {stated}"


_FLAT_NOTE = (
    "another tool wrote it: jaxstruct.io.load(path) gives its arrays as a dict by name; "
    "load(path, target=...) fills a struct by tree path (rename= maps names)"
)
_TARGET_NOTE = (
    "another tool wrote it: load it with jaxstruct.io.load(path, target=...), which fills a "
    "struct of these arrays by tree path (rename= maps names)"
)


def _tensor_specs(fmt: Format, opened: OpenedCheckpoint, where: str) -> dict[str, ArraySpec]:
    """The stored tensors of a checkpoint without a manifest, as its format lists them (a
    malformed list is the format's bug, named as such)."""
    tensors = call_format(fmt, "tensors", where, opened.tensors)
    try:
        return {
            str(name): ArraySpec(np.dtype(spec[0]), tuple(int(n) for n in spec[1]), int(spec[2]))
            for name, spec in tensors.items()
        }
    except (TypeError, ValueError, IndexError, AttributeError) as err:
        raise SerializationError(
            f"{where}: the {fmt.name!r} format ({source_of(fmt)}) listed its tensors wrongly "
            f"({type(err).__name__}: {err}); report it to the format's authors"
        ) from None


def _shown_dtype(dtype: np.dtype) -> str:
    """A dtype as manifests name it (ml_dtypes' bfloat16 and float8s by name: their
    ``str`` is a bare void, ``<V2``)."""
    return dtype.name if dtype.type.__module__.startswith("ml_dtypes") else dtype.str


def _without_manifest(
    target: Path | str, fmt: Format, opened: OpenedCheckpoint, checksums: str, where: str
) -> CheckpointInfo:
    """The report on a checkpoint another tool wrote: its tensors by name."""
    arrays = {
        name: (_shown_dtype(spec.dtype), spec.shape, spec.nbytes)
        for name, spec in _tensor_specs(fmt, opened, where).items()
    }
    label = f"{len(arrays)} tensor{'' if len(arrays) == 1 else 's'} by name (no jaxstruct manifest)"
    lines = [label]
    children: list[dict[str, Any]] = []
    for name, (dtype, shape, nbytes) in arrays.items():
        if len(lines) > _MAX_LINES:
            lines.append(f"... ({len(arrays)} tensors in all; output truncated)")
            break
        shown = f"{dtype}{list(shape)} {_size(nbytes)}"
        lines.append(f"  {clip(name, 200)}: {shown}")
        children.append({"edge": name, "label": shown, "children": []})
    return CheckpointInfo(
        path=target,
        container=fmt.name,
        version=None,
        arrays=arrays,
        total_bytes=sum(n for _, _, n in arrays.values()),
        tree="\n".join(lines),
        tree_json={"edge": "", "label": label, "children": children},
        checksums=checksums,
        has_manifest=False,
        note=_FLAT_NOTE if getattr(opened, "loads_flat", False) is True else _TARGET_NOTE,
    )


def verify_report(path: str | os.PathLike[str], **limits: int) -> tuple[list[str], bool]:
    """Read every array of a checkpoint, without building JAX arrays, and check sizes,
    checksums, dtypes and shapes against the manifest (``jaxstruct inspect --verify``).

    A checkpoint without a manifest (another tool wrote it) has each stored tensor
    read and checked against the format's table of them.

    Returns:
        One message per bad member (``[]`` when sound), and whether checksums were
        checked: the format's own, or jaxstruct's CRC-32s of a plugin format's arrays
        (``False``: a checkpoint carrying none, written by another tool or before
        checksums, has its arrays read one at a time and nothing more).

    Example:
        >>> import tempfile, numpy as np
        >>> from jaxstruct.io import export
        >>> target = Path(tempfile.mkdtemp()) / "ckpt.zip"
        >>> verify_report(export({"w": np.zeros(3)}, target))
        ([], True)
    """
    lim = limits_from_kwargs("verify", limits)
    target = local_or_url(path, "verify")
    where = repr(str(target))
    fmt, opened, top = open_any(target, lim)
    try:
        if top is None:
            specs = _tensor_specs(fmt, opened, where)
        else:
            table = check_arrays_table(top["arrays"], where, lim)
            specs = {k: ArraySpec(*v) for k, v in table.items()}
        try:
            checks = None if top is None else expected_checks(fmt, opened, top, specs, where)
        except SerializationError as err:  # this file lost the checksums its manifest names
            return [str(err)], True
        if checks is None:
            verified = opened.verify(specs)
            if verified is not None:
                return list(verified), True
        problems: list[str] = []
        for key in specs:
            try:
                read_checked(fmt, opened, specs, {key: None}, where, checks=checks)
            except SerializationError as err:
                problems.append(str(err))
        by_format = top is not None and top.get("checksums") == BY_FORMAT
        return problems, checks is not None or (by_format and opened.arrays_checked)
    finally:
        opened.close()
