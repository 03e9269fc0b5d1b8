"""The ``orbax`` format: arrays through orbax-checkpoint, jaxstruct's manifest beside them.

A checkpoint is one orbax composite checkpoint directory with two items:

* ``arrays``: the arrays as a tree of their tree paths
  (``{"params": {"dense": {"kernel": ...}}}``, see ``_names``) saved with
  orbax's PyTree handler, so every process writes the shards it owns
  (replicas once) in parallel, and plain orbax restores them by name;
* ``jaxstruct``: jaxstruct's manifest (classes, static fields, versions),
  written once by the primary process through orbax's JSON handler.

Orbax commits the two together atomically (a temporary directory, then a
rename, with barriers across processes). Array chunks are stored as they are
(zstd only with ``compression="deflate"``) in orbax data files of at most
``DATA_FILE_BYTES``, so tensorstore writes straight from the arrays' buffers.

Every process also saves, as an item of its own, the CRC-32 of each unit it
writes (``_units``); the stored chunks are these units.

Loading reads the manifest bytes itself, within the caller's limits, and
reads the wanted arrays only, as plain arrays: orbax's own metadata never
decides a type, and no module is ever imported. Arrays are read with
tensorstore, unit by unit, each unit checked, straight into their shards or
into one NumPy array (``_read``); a checkpoint written before the unit
checksums goes through orbax's restore for NumPy. Zero-size arrays, which orbax refuses,
are not stored: the manifest's dtype and shape rebuild them.

orbax-checkpoint is imported only when the format is used, so registering
the plugin costs nothing.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from jaxstruct.io import (
    Format,
    Limits,
    OpenedCheckpoint,
    PendingWrite,
    RemoteDirectory,
    host_budget,
    manifest_from_json,
    reserve_host,
    saved_sharding,
)
from jaxstruct.registry import SerializationError

from . import _names, _plain, _read
from ._bucket import OrbaxRemote, replacement
from ._items import (
    ARRAYS,
    MANIFEST_FILE,
    MANIFEST_ITEM,
    RECORD_ITEM,
    STORAGE_ITEM,
    make_checkpointer,
    make_handler,
    orbax_checkpoint,
    parse_item,
    read_item,
    read_records,
    read_storage,
    storage_form,
)
from ._opened import CheckedOrbaxCheckpoint, OrbaxCheckpoint
from ._orbax_internals import STEP_METADATA_FILE, chunk_layout
from ._pinned import check_unchanged, pin
from ._process import one_save_at_a_time, refuse_in_forked_child, tensorstore_ran
from ._shardmeta import sharding_to_json
from ._stores import committed, is_store_url, to_path
from ._units import json_crc, process_record

__all__ = ["OrbaxFormat"]

#: Largest orbax data file (and so stored chunk) written to local files. Orbax's
#: default (2 GiB) keeps a whole checkpoint's compressed chunks in memory until the
#: end of a save, and chunks that large make every resharded restore decode whole shards.
DATA_FILE_BYTES = 32 << 20


#: Largest stored chunk (and checksummed unit, ``_units``) in local files: a resharded
#: restore reads whole units, so small ones keep the blocks in flight small.
CHUNK_BYTES = 4 << 20


def _data_file_bytes(target: Any, arrays: Mapping[str, Any]) -> int:
    """The data file (and stored chunk) size for ``arrays`` saved at ``target``.

    In an object store each data file is an object of the size the reader asks
    for at once (``_read.block_bytes``, from the arrays' global sizes, so every
    process chooses the same), so a restore's requests are whole objects and
    the blocks in flight stay small beside the data.
    """
    if not is_store_url(target):
        return DATA_FILE_BYTES
    return _read.block_bytes(
        sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in arrays.values())
    )


def _sizes(target: Any, arrays: Mapping[str, Any]) -> tuple[int, int]:
    """The data file size and the stored chunk size for ``arrays`` saved at ``target``.

    Local files get small chunks, cheap to check (``CHUNK_BYTES``); in an object store
    a chunk stays the object the reader asks for at once (:func:`_data_file_bytes`).
    """
    file_bytes = _data_file_bytes(target, arrays)
    return file_bytes, file_bytes if is_store_url(target) else min(CHUNK_BYTES, file_bytes)


#: Private switch for tests and measurements: budget arrays on CPU devices too (there,
#: "copying" a shard to the host is a view of it, so the budget only slows the save).
_BUDGET_ON_CPU = False


def _host_budget(arrays: Mapping[str, Any]) -> int | None:
    """The bytes of device-to-host copies a blocking save of ``arrays`` may hold at once:
    what this process copies (its replica-0 shards), within jaxstruct's host budget
    (``JAXSTRUCT_HOST_BUDGET``); ``None`` when every array already lies in host memory.

    Without it, orbax copies every array to the host before it writes any, so the
    host holds the whole model (2.8x it at the peak, measured on a GPU, issue 35).
    With it, arrays are copied in batches within it (an array larger than that
    alone), each batch written, and its copies let go, before the next; the save
    reserves it from the process's budget (:func:`jaxstruct.io.reserve_host`)
    while it runs, so exports in other threads stay within the rest.
    """
    jax_arrays = [a for a in arrays.values() if not isinstance(a, np.ndarray)]
    on_host = all(d.platform == "cpu" for a in jax_arrays for d in a.sharding.device_set)
    if not jax_arrays or (on_host and not _BUDGET_ON_CPU):
        return None
    local = sum(
        math.prod(s.data.shape) * np.dtype(a.dtype).itemsize
        for a in jax_arrays
        for s in a.addressable_shards
        if s.replica_id == 0
    )
    return min(host_budget(), local) or None


def _save_args(
    manifest: bytes, arrays: Mapping[str, Any], data_file_bytes: int, chunk_bytes: int
) -> Any:
    import jax

    ocp = orbax_checkpoint()
    try:
        document = json.loads(manifest)
    except ValueError as err:  # pragma: no cover - export always gives JSON
        raise SerializationError(f"the manifest is not JSON ({err})") from None
    stored, layouts = storage_form(arrays)
    # How each sharded array lay on its mesh, for load(mesh=); the others are absent.
    shardings = {
        key: sharding_to_json(found)
        for key, arr in arrays.items()
        if (found := saved_sharding(arr)) is not None
    }
    storage: dict[str, Any] = {"version": 1, "arrays": layouts, "shardings": shardings}
    raw = dict(stored)  # by manifest key, before nesting
    names = _names.tree_names(document, stored)
    if names is not None:
        storage["names"] = names
        stored = _names.nest({names[key]: arr for key, arr in stored.items()})
    # Every stored unit's CRC-32, in one record per process (_units).
    record = process_record(raw, chunk_bytes, jax.process_index())
    storage["checksums"] = {"units": "crc32", "processes": jax.process_count()}
    storage["manifest_crc32"] = json_crc(document)
    storage["crc32"] = json_crc(storage)
    items: dict[str, Any] = {
        MANIFEST_ITEM: ocp.args.JsonSave(document),
        STORAGE_ITEM: ocp.args.JsonSave(storage),
        **{f"{RECORD_ITEM}{i}": ocp.args.JsonSave(record) for i in range(jax.process_count())},
    }
    if stored:
        chunks = ocp.SaveArgs(chunk_byte_size=chunk_bytes)
        items[ARRAYS] = ocp.args.PyTreeSave(
            stored,
            save_args=jax.tree.map(lambda _: chunks, stored),
            ocdbt_target_data_file_size=data_file_bytes,
        )
    return ocp.args.Composite(**items)


def _wrap_error(target: Any, err: Exception) -> SerializationError:
    import jax

    who = f" in process {jax.process_index()}" if jax.process_count() > 1 else ""
    return SerializationError(
        f"{str(target)!r}: orbax could not write the checkpoint{who} "
        f"({type(err).__name__}: {err}); nothing was committed there"
    )


class _OrbaxPending(PendingWrite):
    def __init__(self, checkpointer: Any, target: Any, layout: Any) -> None:
        self.checkpointer = checkpointer
        self.target = target
        self.layout = layout  # the entered chunk_layout() of this save
        self._done = False

    def wait(self) -> None:
        try:
            self.checkpointer.wait_until_finished()
        except Exception as err:
            raise _wrap_error(self.target, err) from err
        finally:
            if not self._done:
                self.layout.__exit__(None, None, None)
            self._done = True
            self.checkpointer.close()

    def done(self) -> bool:
        return self._done


class OrbaxFormat(Format):
    """Checkpoints written by orbax-checkpoint (tensorstore), with jaxstruct's manifest.

    Every process of a multi-process run calls ``export``/``load`` together;
    each writes and reads only the shards its devices hold. Paths may be any
    location orbax accepts (``gs://bucket/ck`` included).

    Example:
        >>> import tempfile, numpy as np
        >>> from pathlib import Path
        >>> import jaxstruct.io as jio
        >>> path = jio.export({"w": np.arange(3)}, Path(tempfile.mkdtemp()) / "ck", format="orbax")
        >>> jio.load(path)["w"]
        array([0, 1, 2])
    """

    name = "orbax"
    suffixes = ()
    is_directory = True
    remote_paths = True
    publishes_atomically = True
    multiprocess = True
    checks_arrays = True

    def write(
        self,
        target: Any,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        """Save collectively and commit atomically (orbax's temporary directory and rename)."""
        refuse_in_forked_child(repr(str(target)))
        tensorstore_ran()
        args = _save_args(manifest, arrays, *_sizes(target, arrays))
        where = to_path(target)
        budget = _host_budget(arrays)
        handler = make_handler(compression, target, budget)
        checkpointer = make_checkpointer(handler, target)
        try:
            # Orbax's batches of copies come from the process's one host budget, reserved
            # once this save's turn has come.
            with (
                chunk_layout(where),
                one_save_at_a_time(),
                reserve_host(budget) if budget else contextlib.nullcontext(),
            ):
                checkpointer.save(where, args=args)
        except (ValueError, TypeError, RuntimeError) as err:
            raise _wrap_error(target, err) from err
        finally:
            checkpointer.close()
        step("temp-synced")

    def write_async(
        self,
        target: Any,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> PendingWrite | None:
        """Start orbax's asynchronous save: it copies the arrays off the devices, then returns."""
        refuse_in_forked_child(repr(str(target)))
        tensorstore_ran()
        args = _save_args(manifest, _host_safe(arrays), *_sizes(target, arrays))
        where = to_path(target)
        checkpointer = make_checkpointer(make_handler(compression, target), target, background=True)
        layout = chunk_layout(where)
        layout.__enter__()  # until the background save ends (_OrbaxPending.wait)
        try:
            with one_save_at_a_time():
                checkpointer.save(where, args=args)
        except (ValueError, TypeError, RuntimeError) as err:
            checkpointer.close()
            layout.__exit__(None, None, None)
            raise _wrap_error(target, err) from err
        return _OrbaxPending(checkpointer, target, layout)

    def remote_directory(self) -> RemoteDirectory:
        """Steps of a ``CheckpointManager`` at a ``gs://`` or ``s3://`` URL, through orbax's
        path layer."""
        return OrbaxRemote(f"{MANIFEST_ITEM}/{MANIFEST_FILE}")

    def sniff(self, path: Any) -> bool:
        """A directory holding orbax's step metadata and jaxstruct's manifest item, or a
        plain orbax pytree checkpoint (loaded into a ``target=``).

        URLs of no object store (``memory://``) are never orbax checkpoints. In an
        object store, a replacement midway (``overwrite=True``) counts as its new checkpoint.
        """
        if isinstance(path, str) and not is_store_url(path):
            return False
        p = to_path(path)
        try:
            if is_store_url(path) and not committed(p) and replacement(path) is not None:
                return True
            ours = (p / MANIFEST_ITEM / MANIFEST_FILE).exists() and (
                p / STEP_METADATA_FILE
            ).exists()
            return ours or _plain.is_plain(p)
        except OSError:
            return False

    def open(self, path: Any, limits: Limits) -> OpenedCheckpoint:
        """Read jaxstruct's manifest (within ``max_manifest_bytes``); arrays come later."""
        where = repr(str(path))
        refuse_in_forked_child(where)
        p = to_path(path)
        if is_store_url(path) and not committed(p):
            staged = replacement(path)  # an overwrite=True midway: its new checkpoint
            p = p if staged is None else to_path(staged)
        if not committed(p):
            raise SerializationError(
                f"{where}: this orbax checkpoint was never committed (its save stopped "
                "midway, or is still running); load another one"
            )
        pinned = pin(p)  # before the first read: compared after the last one
        try:
            return self._open_pinned(p, pinned, limits, where)
        except (SerializationError, OSError):
            check_unchanged(p, pinned, where)  # it failed because an overwrite swapped it
            raise

    def _open_pinned(
        self, p: Any, pinned: tuple[int, int, int] | None, limits: Limits, where: str
    ) -> OpenedCheckpoint:
        file = p / MANIFEST_ITEM / MANIFEST_FILE
        if not file.exists() and _plain.is_plain(p):
            return _plain.PlainOrbaxCheckpoint(p, limits, where)
        manifest = read_item(
            file, limits, where, "the manifest", missing="the jaxstruct manifest item is missing"
        )
        layouts, shardings, names, sums = read_storage(p, limits, where)
        check_unchanged(p, pinned, where)  # the two items may come from two exports
        document = parse_item(manifest, where, "jaxstruct manifest item")
        if not isinstance(document, dict) or document.get("version") != 1:
            # orbax wrote the manifest out as JSON of its own: the bytes export sealed
            # come back from the document (its seal as stored, checked on load).
            manifest = manifest_from_json(document, where=where)
        if sums is None:  # a checkpoint of jaxstruct-orbax before 0.2: unchecked
            return OrbaxCheckpoint(
                p, manifest, layouts, shardings, where, names=names, pinned=pinned
            )
        manifest_crc, processes = sums
        if json_crc(document) != manifest_crc:
            raise SerializationError(
                f"{where}: the jaxstruct manifest item does not match its checksum: the "
                "checkpoint is corrupt; restore it from a copy"
            )
        units = None if processes is None else read_records(p, processes, limits, where)
        return CheckedOrbaxCheckpoint(
            p, manifest, layouts, shardings, where, names=names, pinned=pinned, units=units
        )


def _host_safe(arrays: Mapping[str, Any]) -> dict[str, Any]:
    """NumPy inputs copied (the caller may mutate them once the call returns)."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
