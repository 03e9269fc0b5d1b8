"""The record of each array's sharding in an orbax checkpoint's storage item (JSON).

``load(path, mesh=mesh)`` reads it to put every array back with the
``PartitionSpec`` it was saved with (see :mod:`jaxstruct.io`'s ``SavedSharding``).
"""

from __future__ import annotations

from typing import Any

from jaxstruct.io import SavedSharding
from jaxstruct.registry import SerializationError

__all__ = ["sharding_from_json", "sharding_to_json"]

SpecEntry = None | str | tuple[str, ...]


def sharding_to_json(saved: SavedSharding | None) -> Any:
    """The JSON form of ``saved`` (``null`` when unknown)."""
    if saved is None:
        return None
    return {
        "spec": [list(e) if isinstance(e, tuple) else e for e in saved.spec],
        "mesh": [[name, size] for name, size in saved.mesh],
    }


def _is_name(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 256


def sharding_from_json(value: Any, key: str, where: str) -> SavedSharding | None:
    """Check and parse the JSON form written by :func:`sharding_to_json`."""
    if value is None:
        return None
    bad = SerializationError(f"{where}: malformed sharding record for array {key!r}")
    if not isinstance(value, dict) or set(value) != {"spec", "mesh"}:
        raise bad
    spec, mesh = value["spec"], value["mesh"]
    if not isinstance(spec, list) or not isinstance(mesh, list) or len(mesh) > 64:
        raise bad
    axes: list[tuple[str, int]] = []
    for item in mesh:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not _is_name(item[0])
            or isinstance(item[1], bool)
            or not isinstance(item[1], int)
            or item[1] < 1
        ):
            raise bad
        axes.append((item[0], item[1]))
    names = {name for name, _ in axes}
    entries: list[SpecEntry] = []
    for entry in spec:
        if entry is None:
            entries.append(None)
        elif _is_name(entry) and entry in names:
            entries.append(entry)
        elif isinstance(entry, list) and entry and all(e in names for e in entry):
            entries.append(tuple(entry))
        else:
            raise bad
    return SavedSharding(tuple(entries), tuple(axes))
