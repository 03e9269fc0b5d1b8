"""Shardings recorded when a checkpoint is saved, and put back on a mesh when it is loaded.

A format that can, records each array's :class:`SavedSharding` (its
``PartitionSpec`` entries and the axis names and sizes of its mesh);
``load(path, mesh=mesh)`` then builds a ``NamedSharding`` on ``mesh`` for
every array from that record alone, with no template. Axes are matched by
name: an axis the new mesh lacks is dropped from the spec (that dimension is
replicated), or refused with ``strict_mesh=True``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from jaxstruct.registry import SerializationError

__all__ = [
    "SavedSharding",
    "mesh_placements",
    "saved_sharding",
]

#: One entry of a PartitionSpec: no axis, one mesh axis, or several.
SpecEntry = None | str | tuple[str, ...]


class SavedSharding(NamedTuple):
    """How one array was sharded when saved.

    Attributes:
        spec: the ``PartitionSpec`` entries, one per leading dimension.
        mesh: ``(axis name, size)`` of each axis of the mesh it lay on.
    """

    spec: tuple[SpecEntry, ...]
    mesh: tuple[tuple[str, int], ...]


def saved_sharding(arr: Any) -> SavedSharding | None:
    """Return how ``arr`` is sharded, or ``None`` (NumPy, or not a ``NamedSharding``).

    ``None`` is stored for arrays that lie whole on one device or on the host;
    ``load(mesh=)`` replicates them.
    """
    if "jax" not in sys.modules:
        return None
    import jax

    sharding = getattr(arr, "sharding", None)
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    spec: list[SpecEntry] = []
    for entry in sharding.spec:
        if entry is None or entry is jax.sharding.PartitionSpec.UNCONSTRAINED:
            spec.append(None)
        elif isinstance(entry, str):
            spec.append(entry)
        else:
            spec.append(tuple(str(name) for name in entry))
    mesh = tuple((str(name), int(size)) for name, size in sharding.mesh.shape.items())
    return SavedSharding(tuple(spec), mesh)


def _entry_on(entry: SpecEntry, mesh_axes: set[str]) -> tuple[SpecEntry, list[str]]:
    """``entry`` restricted to ``mesh_axes``, and the names it lost."""
    if entry is None:
        return None, []
    names = (entry,) if isinstance(entry, str) else entry
    kept = tuple(n for n in names if n in mesh_axes)
    lost = [n for n in names if n not in mesh_axes]
    if not kept:
        return None, lost
    return (kept[0] if isinstance(entry, str) else kept), lost


def mesh_placements(
    saved: Mapping[str, SavedSharding | None] | None,
    keys: Iterable[str],
    mesh: Any,
    *,
    strict: bool,
    where: str,
) -> dict[str, Any]:
    """A ``NamedSharding`` on ``mesh`` for each of ``keys``, from the shardings saved.

    ``saved`` is ``None`` when the checkpoint did not record shardings.

    Raises:
        SerializationError: the checkpoint has no record, or (``strict``) an
            array was sharded along an axis ``mesh`` does not have.
    """
    import jax

    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"load(): mesh expected a jax.sharding.Mesh, got {mesh!r}")
    if saved is None:
        raise SerializationError(
            f"{where}: this checkpoint does not record how its arrays were sharded (the "
            "built-in formats never do; the 'orbax' format does from jaxstruct-orbax 0.1.0), "
            "so load(mesh=) cannot place them. Pass target= (jax.eval_shape of the value, "
            "with shardings) instead, or load without mesh= and jax.device_put the result"
        )
    mesh_axes = set(mesh.axis_names)
    out = {}
    for key in keys:
        record = saved.get(key)
        entries: list[SpecEntry] = []
        for entry in record.spec if record is not None else ():
            kept, lost = _entry_on(entry, mesh_axes)
            if lost and strict:
                raise SerializationError(
                    f"{where}: array {key!r} was saved sharded along mesh axes {lost}, which "
                    f"the given mesh (axes {list(mesh.axis_names)}) lacks; pass "
                    "strict_mesh=False to replicate along them, or a mesh with those axes"
                )
            entries.append(kept)
        out[key] = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*entries))
    return out
