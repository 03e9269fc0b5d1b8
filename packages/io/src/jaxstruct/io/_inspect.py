"""Describing a checkpoint without loading its arrays or importing anything."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from jaxstruct.registry import SerializationError

from ._checkpoint import open_checkpoint
from ._limits import limits_from_kwargs
from ._manifest import check_arrays_table

__all__ = ["CheckpointInfo", "inspect"]

_MAX_LINES = 20_000
_MAX_INDENT = 48


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What :func:`inspect` reports about a checkpoint.

    Attributes:
        path: the checkpoint.
        container: its format name (``"directory"``, ``"zip"``, or a plugin's).
        version: the format version.
        arrays: ``key -> (dtype name, shape, bytes)``.
        total_bytes: decoded size of all arrays.
        tree: the stored value as an indented tree, one node per line.
    """

    path: Path
    container: str
    version: int
    arrays: dict[str, tuple[str, tuple[int, ...], int]]
    total_bytes: int
    tree: str

    def __str__(self) -> str:
        return (
            f"{self.path} ({self.container} checkpoint, format version {self.version}, "
            f"{len(self.arrays)} arrays, {_size(self.total_bytes)})\n{self.tree}"
        )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _describe(
    node: Any, arrays: dict[str, tuple[str, tuple[int, ...], int]]
) -> tuple[str, list[tuple[str, Any]]]:
    """Return a label for ``node`` and its ``(edge label, child index)`` pairs."""
    tag = node[0]
    if tag in ("list", "tuple", "set", "frozenset"):
        return f"{tag} ({len(node[1])} items)", [(f"[{i}]", c) for i, c in enumerate(node[1])]
    if tag == "dict":
        items = node[1]
        return f"dict ({len(items) // 2} items)", [
            ("<key>" if i % 2 == 0 else "<value>", c) for i, c in enumerate(items)
        ]
    if tag == "namedtuple":
        return f"namedtuple {node[1]}", [(f"[{i}]", c) for i, c in enumerate(node[2])]
    if tag == "struct":
        version = f", schema version {node[2]}" if node[2] else ""
        return f"{node[1]} (struct{version})", [(f".{k}", c) for k, c in node[3].items()]
    if tag == "pytree":
        kids = [("<payload>", node[3])] + [(f"<child {i}>", c) for i, c in enumerate(node[4])]
        return f"{node[1]} (registered pytree)", kids
    if tag == "codec":
        return f"<codec {node[1]!r}>", [("<data>", node[2])]
    if tag in ("array", "jaxarray"):
        dtype, shape, nbytes = arrays[node[1]]
        kind = "jax array" if tag == "jaxarray" else "array"
        if len(node) == 3:
            kind = "weakly typed " + kind
        return f"{kind} {dtype}{list(shape)} {_size(nbytes)} ({node[1]})", []
    if tag == "enum":
        return f"enum {node[1]}.{node[2]}", []
    if tag == "npscalar":
        return f"numpy scalar {node[1]} 0x{node[2]}", []
    if tag == "none":
        return "None", []
    if tag == "path":
        return f"{node[1]}({node[2]!r})", []
    if tag == "bytes":
        return f"bytes (base64 {_clip(repr(node[1]), 40)})", []
    if tag in ("bool", "int", "float", "str", "complex"):
        return f"{tag} {_clip(repr(node[1:]) if tag == 'complex' else repr(node[1]))}", []
    raise SerializationError(f"unknown node tag {tag!r}")


def _render(
    nodes: list[Any], root: int, arrays: dict[str, tuple[str, tuple[int, ...], int]]
) -> str:
    lines: list[str] = []
    stack: list[tuple[int, str, int]] = [(root, "", 0)]
    while stack:
        if len(lines) >= _MAX_LINES:
            lines.append(f"... ({len(nodes)} nodes in all; output truncated)")
            break
        index, edge, depth = stack.pop()
        if type(index) is not int or not 0 <= index < len(nodes):
            raise SerializationError(f"child index {index!r} is out of range")
        label, kids = _describe(nodes[index], arrays)
        indent = "  " * min(depth, _MAX_INDENT) + ("" if depth <= _MAX_INDENT else f"[{depth}] ")
        lines.append(f"{indent}{edge + ': ' if edge else ''}{label}")
        for kid_edge, kid in reversed(kids):
            if type(kid) is not int or not 0 <= kid < index:
                raise SerializationError(f"child index {kid!r} of node {index} is invalid")
            stack.append((kid, kid_edge, depth + 1))
    return "\n".join(lines)


def inspect(path: str | os.PathLike[str], **limits: int) -> CheckpointInfo:
    """Describe a checkpoint: classes, fields, shapes, dtypes, sizes and format version.

    Only the manifest is read: no array data, no imports, no class lookups.

    Args:
        path: a checkpoint directory or ``.zip`` archive.
        **limits: ``max_manifest_bytes=`` and ``max_array_bytes=`` as for :func:`load`.

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
        >>> print(inspect(target).tree)
        dict (1 items)
          <key>: str 'w'
          <value>: array <f4[2, 3] 24 B (a0)
    """
    lim = limits_from_kwargs("inspect", limits)
    target = Path(os.fspath(path))
    where = repr(str(target))
    fmt, opened, top = open_checkpoint(target, lim)
    opened.close()
    table = check_arrays_table(top["arrays"], where, lim)
    arrays = {k: (top["arrays"][k]["dtype"], shape, n) for k, (_, shape, n) in table.items()}
    manifest = top["manifest"]
    try:
        nodes, root = manifest["nodes"], manifest["root"]
        if not isinstance(nodes, list) or type(root) is not int or root != len(nodes) - 1:
            raise SerializationError("the manifest root must be the index of the last node")
        tree = _render(nodes, root, arrays)
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
    )
