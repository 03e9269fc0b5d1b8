"""Orbax checkpoints of plain pytrees (no jaxstruct manifest), opened for a ``target=``.

A checkpoint that ``ocp.StandardCheckpointer().save(path, {"params": ...})``
(or flax, or maxtext) wrote holds orbax's ``_METADATA`` (the tree of its
arrays' names, shapes and dtypes) and the arrays, but no classes. It opens as
an :class:`~jaxstruct.io.OpenedCheckpoint` without a manifest:
:func:`jaxstruct.io.load` then fills a ``target=`` by tree path (see
``jaxstruct.io._plain``). Each array is named by its orbax tree path with
:func:`jaxstruct.io.join_path` (``params.dense.kernel``,
``params.layers.0.w``).

``_METADATA`` is read by orbax as JSON once its size is checked against
``max_manifest_bytes``; leaves that are not arrays (Python scalars, strings)
are not tensors and are ignored. Reading restores only the wanted arrays
(orbax's ``PLACEHOLDER`` for the others), each straight into the target's
sharding or as NumPy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from jaxstruct.io import ArraySpec, Limits, OpenedCheckpoint, join_path
from jaxstruct.registry import SerializationError

__all__ = ["PlainOrbaxCheckpoint", "is_plain"]

_TREE_METADATA = "_METADATA"


def _ocp() -> Any:
    import orbax.checkpoint as ocp

    return ocp


def is_plain(p: Any) -> bool:
    """Whether the directory ``p`` holds a plain orbax PyTree checkpoint (its ``_METADATA``)."""
    try:
        return (p / _TREE_METADATA).exists()
    except OSError:
        return False


def _step(entry: Any) -> object:
    for attr in ("key", "idx", "name"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return str(entry)  # pragma: no cover - a key type JAX may add later


def _path_name(path: Any) -> str:
    return join_path(_step(e) for e in path)


class PlainOrbaxCheckpoint(OpenedCheckpoint):
    """A plain orbax checkpoint: its arrays by tree path, read on demand into a target."""

    manifest = None
    # What jaxstruct checks of it (``inspect`` says so); its scalar and string leaves are not
    # tensors, so a load needs a target (``loads_flat`` stays false).
    checksum_scheme = "none checked by jaxstruct: written by another tool (orbax itself)"

    def __init__(self, path: Any, limits: Limits, where: str) -> None:
        import jax

        self.path = path
        self.where = where
        file = path / _TREE_METADATA
        size = file.stat().length
        if size > limits.max_manifest_bytes:
            raise SerializationError(
                f"{where}: orbax's {_TREE_METADATA} is {size} bytes, more than "
                f"max_manifest_bytes={limits.max_manifest_bytes}; if you trust this checkpoint, "
                "pass a larger max_manifest_bytes="
            )
        ocp = _ocp()
        try:
            metadata = ocp.PyTreeCheckpointer().metadata(path)
        except Exception as err:
            raise SerializationError(
                f"{where}: orbax could not read the checkpoint's metadata "
                f"({type(err).__name__}: {err})"
            ) from None
        tree = getattr(metadata, "item_metadata", metadata)
        self.tree = getattr(tree, "tree", tree)
        self.specs: dict[str, ArraySpec] = {}
        total = 0
        for key_path, leaf in jax.tree_util.tree_flatten_with_path(self.tree)[0]:
            shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
            if shape is None or dtype is None:
                continue  # a scalar or string leaf: not a tensor
            try:
                dtype = np.dtype(dtype)
                shape = tuple(int(n) for n in shape)
            except (TypeError, ValueError):
                raise SerializationError(
                    f"{where}: the array {_path_name(key_path)!r} has an unreadable dtype or "
                    f"shape in orbax's metadata ({dtype!r}, {shape!r})"
                ) from None
            nbytes = math.prod(shape) * dtype.itemsize
            total += nbytes
            self.specs[_path_name(key_path)] = ArraySpec(dtype, shape, nbytes)
        if len(self.specs) > limits.max_nodes:
            raise SerializationError(
                f"{where}: the checkpoint holds {len(self.specs)} arrays, more than max_nodes="
                f"{limits.max_nodes}"
            )
        if total > limits.max_array_bytes:
            raise SerializationError(
                f"{where}: the arrays hold {total} bytes, more than max_array_bytes="
                f"{limits.max_array_bytes}; if you trust this checkpoint, pass a larger "
                "max_array_bytes="
            )

    def tensors(self) -> dict[str, ArraySpec]:
        return dict(self.specs)

    def read_arrays(
        self, table: Mapping[str, ArraySpec], wanted: Mapping[str, Any]
    ) -> dict[str, Any]:
        import jax

        ocp = _ocp()

        def item(path: Any, leaf: Any) -> Any:
            name = _path_name(path)
            if name not in wanted:
                return ocp.PLACEHOLDER
            spec, placement = self.specs[name], wanted[name]
            if placement is None:
                return np.empty((0,), spec.dtype)
            return jax.ShapeDtypeStruct(spec.shape, spec.dtype, sharding=placement)

        def restore_args(path: Any, leaf: Any) -> Any:
            name = _path_name(path)
            if name not in wanted:
                return ocp.PLACEHOLDER
            spec, placement = self.specs[name], wanted[name]
            if placement is None:
                return ocp.RestoreArgs(restore_type=np.ndarray, dtype=spec.dtype)
            return ocp.ArrayRestoreArgs(
                sharding=placement, global_shape=spec.shape, dtype=spec.dtype
            )

        with_path = jax.tree_util.tree_map_with_path
        checkpointer = ocp.PyTreeCheckpointer()
        try:
            restored = checkpointer.restore(
                self.path,
                args=ocp.args.PyTreeRestore(
                    item=with_path(item, self.tree),
                    restore_args=with_path(restore_args, self.tree),
                ),
            )
        except Exception as err:
            raise SerializationError(
                f"{self.where}: orbax could not read the arrays ({type(err).__name__}: {err})"
            ) from None
        finally:
            checkpointer.close()
        out = {}
        for path, value in jax.tree_util.tree_flatten_with_path(restored)[0]:
            name = _path_name(path)
            if name in wanted:
                out[name] = value
        missing = sorted(set(wanted) - set(out))[:5]
        if missing:  # pragma: no cover - orbax returned fewer arrays than asked
            raise SerializationError(f"{self.where}: orbax did not return {missing}")
        return out
