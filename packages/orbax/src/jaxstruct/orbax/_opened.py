"""Reading a ``format="orbax"`` checkpoint opened by the format: its stored shapes and
shardings, and its arrays, read unit by unit (``_read``) and checked; a checkpoint of
jaxstruct-orbax 0.1 in blocks, each stored chunk checked by tensorstore's ``crc32c``
codec (found in every array's codecs before it is read); one written before checksums
through orbax's restore, unchecked."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from jaxstruct.io import ArraySpec, OpenedCheckpoint, SavedSharding, place
from jaxstruct.registry import SerializationError

from . import _names
from ._items import (
    ARRAYS,
    from_storage,
    make_checkpointer,
    make_handler,
    orbax_checkpoint,
)
from ._orbax_internals import open_array_stores
from ._pinned import check_unchanged
from ._process import tensorstore_ran
from ._read import ChecksumMismatch, Job, Pace, read_into_host, read_into_shards
from ._stores import is_store_url
from ._units import Units

__all__ = ["CheckedOrbaxCheckpoint", "OrbaxCheckpoint"]


class OrbaxCheckpoint(OpenedCheckpoint):
    def __init__(
        self,
        path: Any,
        manifest: bytes,
        layouts: dict[str, dict[str, str]],
        shardings: dict[str, SavedSharding | None] | None,
        where: str,
        *,
        names: dict[str, str] | None = None,
        pinned: tuple[int, int, int] | None = None,
        units: dict[str, Units] | None = None,
    ) -> None:
        self.path = path
        self.pinned = pinned  # the directory's identity when it was opened (_pinned)
        self.manifest = manifest
        self.layouts = layouts
        self.shardings = shardings
        self.where = where
        self.names = names  # array key -> its name in the arrays item (None: the key)
        # array key -> its stored units and their CRC-32s (None: a checkpoint without them)
        self.units = units
        self.use_zarr3 = False
        # Checksums present and intact (the storage item's own CRC matched): every read
        # checks them, the unit CRCs or tensorstore's crc32c codec (see _jobs).
        self.arrays_checked = isinstance(self, CheckedOrbaxCheckpoint)
        # What protects the stored bytes, as jaxstruct.io.inspect reports it.
        self.checksum_scheme = "none: written by jaxstruct-orbax before checksums"
        if self.arrays_checked:
            self.checksum_scheme = (
                "CRC-32C per stored chunk (tensorstore), CRC-32 of the manifest"
                if units is None
                else "CRC-32 per stored unit of every array, and of the manifest"
            )

    def _name(self, key: str) -> str:
        return key if self.names is None else self.names.get(key, key)

    def close(self) -> None:
        pass

    def saved_shardings(self) -> dict[str, SavedSharding | None] | None:
        """How each array was sharded when saved (``None``: an older checkpoint)."""
        return self.shardings

    def _stored_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Shape and dtype of each stored array per orbax's metadata (checked, never trusted)."""
        ocp = orbax_checkpoint()
        handler = ocp.PyTreeCheckpointHandler()
        try:
            metadata = handler.metadata(self.path / ARRAYS)
            tree = metadata.tree
            self.use_zarr3 = bool(getattr(metadata, "use_zarr3", False))
        except Exception as err:
            raise SerializationError(
                f"{self.where}: orbax cannot read the arrays item ({type(err).__name__}: {err})"
            ) from None
        finally:
            handler.close()
        if not isinstance(tree, Mapping):
            raise SerializationError(f"{self.where}: the arrays item is not a mapping")
        if self.names is None:
            leaves = dict(tree)
        else:  # by tree path: back to the manifest's keys (an unknown name stays, and fails)
            keys = {name: key for key, name in self.names.items()}
            leaves = {keys.get(n, n): v for n, v in _names.flatten(tree, self.where).items()}
        out = {}
        for key, meta in leaves.items():
            shape = getattr(meta, "shape", None)
            dtype = getattr(meta, "dtype", None)
            if not isinstance(key, str) or shape is None or dtype is None:
                raise SerializationError(
                    f"{self.where}: stored array {key!r} has no shape or dtype"
                )
            out[key] = (tuple(shape), np.dtype(dtype).str)
        return out

    def _storage_spec(self, spec: ArraySpec, layout: Mapping[str, str]) -> tuple[Any, np.dtype]:
        dtype, shape = np.dtype(spec[0]), tuple(spec[1])
        kind = layout.get("as")
        if kind == "bool":
            return shape, np.dtype(np.uint8)
        if kind == "bytes":
            return (*shape, dtype.itemsize), np.dtype(np.uint8)
        return shape, dtype

    def read_arrays(
        self, table: Mapping[str, ArraySpec], wanted: Mapping[str, Any]
    ) -> dict[str, Any]:
        tensorstore_ran()
        try:
            out = self._read_arrays(table, wanted)
        except SerializationError:
            check_unchanged(self.path, self.pinned, self.where)  # failed as it was swapped
            raise
        check_unchanged(self.path, self.pinned, self.where)  # read from the opened one
        return out

    def _read_arrays(
        self, table: Mapping[str, ArraySpec], wanted: Mapping[str, Any]
    ) -> dict[str, Any]:
        unknown = sorted(set(self.layouts) - set(table))[:5]
        if unknown:
            raise SerializationError(
                f"{self.where}: the storage item names arrays {unknown} the manifest lacks"
            )
        storage = {
            k: self._storage_spec(spec, self.layouts.get(k, {})) for k, spec in table.items()
        }
        expected = {k for k, (shape, dt) in storage.items() if math.prod(shape) * dt.itemsize > 0}
        if self.units is not None:
            # Unit records name every stored array and check every byte read: orbax's own
            # metadata (``_METADATA``) decides nothing. Each array is opened as zarr v3 (the
            # only layout saved with unit records) and its shape and dtype compared (_jobs).
            self.use_zarr3 = True
            stored = {k: (tuple(storage[k][0]), storage[k][1].str) for k in expected}
        else:
            stored = self._stored_shapes() if expected else {}
        if set(stored) != expected:
            extra = sorted(set(stored) - expected)[:5]
            missing = sorted(expected - set(stored))[:5]
            raise SerializationError(
                f"{self.where}: the arrays item must hold exactly the non-empty arrays the "
                f"manifest names (unexpected: {extra}, missing: {missing})"
            )
        for key, (shape, dtype) in stored.items():
            want_shape, want_dtype = storage[key]
            if shape != want_shape or dtype != want_dtype.str:
                raise SerializationError(
                    f"{self.where}: array {key!r} is stored with shape {shape} and dtype "
                    f"{dtype}, but the manifest says {want_shape} and {want_dtype}"
                )
        out: dict[str, Any] = {}
        to_read = {k: p for k, p in wanted.items() if k in stored}
        for key in wanted:
            if key not in stored:  # empty: nothing to read
                spec = table[key]
                out[key] = place(np.empty(spec[1], dtype=spec[0]), wanted[key])
        if not to_read:
            return out
        sharded = {
            k: p
            for k, p in to_read.items()
            if p is not None and self.layouts.get(k, {}).get("as") != "bytes"
        }
        if sharded:
            out.update(self._read_sharded(sharded, storage))
        on_host = {k: p for k, p in to_read.items() if k not in sharded}
        if on_host:
            out.update(self._read_on_host(on_host, storage, table, len(on_host) < len(stored)))
        return out

    def _jobs(
        self, wanted: Mapping[str, Any], storage: Mapping[str, tuple[Any, np.dtype]]
    ) -> tuple[dict[str, Job], Pace]:
        """Open each wanted array's tensorstore; its job and the pace of the read."""
        # From an object store, a block holds its response in memory while it is
        # decoded: blocks shrink with the data there. Local files keep the largest.
        total = sum(math.prod(storage[k][0]) * np.dtype(storage[k][1]).itemsize for k in wanted)
        pace = Pace.of(total, remote=is_store_url(str(self.path)))
        if self.units is not None:  # each unit (a stored chunk) is read once: no chunk cache
            pace = pace._replace(cached=False)
        opening = open_array_stores(
            self.path / ARRAYS,
            [self._name(key) for key in wanted],
            use_zarr3=self.use_zarr3,
            cache_bytes=pace.cache,
        )
        jobs = {}
        for key, placement in wanted.items():
            store = opening[self._name(key)].result()
            shape, dtype = storage[key]
            if tuple(store.shape) != tuple(shape) or store.dtype.numpy_dtype != dtype:
                raise SerializationError(
                    f"{self.where}: array {self._name(key)!r} is stored with shape "
                    f"{tuple(store.shape)} and dtype {store.dtype.numpy_dtype}, but the manifest "
                    f"says {tuple(shape)} and {dtype}: the checkpoint is corrupt; restore it "
                    "from a copy"
                )
            if self.units is None and self.arrays_checked and not _has_crc32c(store):
                raise SerializationError(
                    f"{self.where}: array {self._name(key)!r} is stored without the crc32c "
                    "codec this checkpoint's storage item promises: the checkpoint is "
                    "corrupt; restore it from a copy"
                )
            view = np.dtype(np.bool_) if self.layouts.get(key, {}).get("as") == "bool" else None
            units = None if self.units is None else self.units.get(key, [])
            jobs[key] = Job(store, tuple(shape), placement, view, units)
        return jobs, pace

    def _read_failure(self, err: Exception) -> SerializationError:
        """Our error for a failed read: a unit that fails its check names its array."""
        if isinstance(err, ChecksumMismatch):
            return _mismatch(self.where, err, self._name(err.key))
        return _read_error(self.where, err)

    def _read_sharded(
        self, wanted: Mapping[str, Any], storage: Mapping[str, tuple[Any, np.dtype]]
    ) -> dict[str, Any]:
        """Arrays placed on devices: read straight into their shards (see ``_read``)."""
        orbax_checkpoint()
        try:
            return read_into_shards(*self._jobs(wanted, storage))
        except SerializationError:
            raise
        except Exception as err:
            raise self._read_failure(err) from None

    def _read_units_on_host(
        self,
        to_read: Mapping[str, Any],
        storage: Mapping[str, tuple[Any, np.dtype]],
        table: Mapping[str, ArraySpec],
    ) -> dict[str, Any]:
        """Arrays wanted as NumPy (or stored as raw bytes), unit by unit, each checked (or,
        of jaxstruct-orbax 0.1, in blocks of chunks tensorstore checks)."""
        orbax_checkpoint()
        try:
            jobs, pace = self._jobs(dict.fromkeys(to_read), storage)
            hosts = read_into_host(jobs, pace)
        except SerializationError:
            raise
        except Exception as err:
            raise self._read_failure(err) from None
        return {
            key: from_storage(
                hosts[key], self.layouts.get(key, {}), np.dtype(table[key][0]), placement
            )
            for key, placement in to_read.items()
        }

    def _read_on_host(
        self,
        to_read: Mapping[str, Any],
        storage: Mapping[str, tuple[Any, np.dtype]],
        table: Mapping[str, ArraySpec],
        partial: bool,
    ) -> dict[str, Any]:
        """Arrays wanted as NumPy (or stored as raw bytes): by jaxstruct's reader where the
        checkpoint has checksums, else through orbax's restore."""
        if self.arrays_checked:
            return self._read_units_on_host(to_read, storage, table)
        ocp = orbax_checkpoint()
        item: dict[str, Any] = {}
        restore_args: dict[str, Any] = {}
        for key in to_read:
            _, dtype = storage[key]
            item[self._name(key)] = np.empty((0,), dtype)  # structure only; restored as NumPy
            restore_args[self._name(key)] = ocp.RestoreArgs(restore_type=np.ndarray, dtype=dtype)
        if self.names is not None:
            item, restore_args = _names.nest(item), _names.nest(restore_args)
        checkpointer = make_checkpointer(make_handler(None, self.path), self.path)
        try:
            restored = checkpointer.restore(
                self.path,
                args=ocp.args.Composite(
                    **{
                        ARRAYS: ocp.args.PyTreeRestore(
                            item=item,
                            restore_args=restore_args,
                            partial_restore=partial,
                        )
                    }
                ),
            )[ARRAYS]
            if self.names is not None:
                restored = _names.flatten(restored, self.where)
        except Exception as err:
            raise _read_error(self.where, err) from None
        finally:
            checkpointer.close()
        return {
            key: from_storage(
                restored[self._name(key)],
                self.layouts.get(key, {}),
                np.dtype(table[key][0]),
                placement,
            )
            for key, placement in to_read.items()
        }


class CheckedOrbaxCheckpoint(OrbaxCheckpoint):
    """A checkpoint with checksums: a CRC-32 per stored unit that every read checks
    (``units``), or, written by jaxstruct-orbax 0.1, a CRC-32C per chunk that
    tensorstore checks."""

    def verify(self, table: Mapping[str, ArraySpec]) -> list[str]:
        """Read (and so check) every array, one at a time; one message per bad array."""
        return self.verify_by_reading(table)


def _has_crc32c(store: Any) -> bool:
    """Whether every chunk of the open zarr v3 ``store`` ends with a CRC-32C that
    tensorstore checks (its codec chain holds ``crc32c``)."""
    try:
        codecs = store.codec.to_json().get("codecs", [])
    except (AttributeError, ValueError):
        return False
    return any(isinstance(c, dict) and c.get("name") == "crc32c" for c in codecs)


def _mismatch(where: str, err: ChecksumMismatch, name: str) -> SerializationError:
    """Our error for a unit failing its CRC-32, or an array its units do not cover
    (``name``: the array's tree path, as the arrays item stores it)."""
    if err.box is None:
        return SerializationError(
            f"{where}: the checksum records do not cover array {name!r}: the checkpoint "
            "is corrupt or incomplete; restore it from a copy"
        )
    region = ", ".join(f"{lo}:{hi}" for lo, hi in err.box)
    return SerializationError(
        f"{where}: array {name!r}, stored region [{region}], does not match its checksum: "
        "the checkpoint is corrupt; restore it from a copy"
    )


def _read_error(where: str, err: Exception) -> SerializationError:
    """Our error for a failed read; a chunk failing its checksum says so first."""
    text = f"{type(err).__name__}: {err}"
    if "DATA_LOSS" in text or "mismatch" in text:
        return SerializationError(
            f"{where}: a stored chunk does not match its checksum: the checkpoint is corrupt; "
            f"restore it from a copy ({text})"
        )
    return SerializationError(
        f"{where}: orbax could not read the arrays ({text}); if this persists, the "
        "checkpoint is damaged or incomplete: restore it from a copy"
    )
