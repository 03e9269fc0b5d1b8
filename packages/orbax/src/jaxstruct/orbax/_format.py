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

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from jaxstruct.io import (
    ArraySpec,
    Format,
    Limits,
    OpenedCheckpoint,
    PendingWrite,
    RemoteDirectory,
    SavedSharding,
    host_array,
    parse_json,
    place,
    saved_sharding,
    sync_timeout,
)
from jaxstruct.registry import SerializationError

from . import _names, _plain, _read
from ._bucket import OrbaxRemote, replacement
from ._orbax_internals import STEP_METADATA_FILE, chunk_layout, open_array_stores
from ._pinned import check_unchanged, pin
from ._process import one_save_at_a_time, refuse_in_forked_child, tensorstore_ran
from ._read import ChecksumMismatch, Job, Pace, read_into_host, read_into_shards
from ._shardmeta import sharding_from_json, sharding_to_json
from ._stores import committed, is_store_url, temporary_path_class, to_path
from ._units import Units, json_crc, parse_record, process_record

__all__ = ["OrbaxFormat"]

ARRAYS = "arrays"
MANIFEST_ITEM = "jaxstruct"
STORAGE_ITEM = "jaxstruct_storage"
#: Each process's record of the CRC-32s of the units it wrote (``_units``): item ``<this><i>``.
RECORD_ITEM = "jaxstruct_checksums_"
_MANIFEST_FILE = "metadata"  # the JSON handler's default file name


def _ocp() -> Any:
    try:
        import orbax.checkpoint as ocp
    except ImportError as err:  # pragma: no cover - a dependency of this distribution
        raise SerializationError(
            f"the 'orbax' format needs orbax-checkpoint ({err}); pip install jaxstruct-orbax"
        ) from None
    return ocp


# Dtypes tensorstore stores as they are (native byte order). Every other dtype is
# stored in a portable form recorded in the ``storage`` item: ``"bool"`` (as
# uint8) or ``"bytes"`` (the raw bytes, one trailing axis of itemsize).
_NATIVE_NAMES = (
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "complex64",
    "complex128",
)
_NATIVE_ML = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


def _native() -> frozenset[np.dtype]:
    import ml_dtypes

    names = [np.dtype(n) for n in _NATIVE_NAMES]
    names += [np.dtype(getattr(ml_dtypes, n)) for n in _NATIVE_ML if hasattr(ml_dtypes, n)]
    return frozenset(names)


def _fortran(arr: np.ndarray) -> bool:
    return arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous


def _to_storage(arr: Any, native: frozenset[np.dtype]) -> tuple[Any, dict[str, str]]:
    """Return the array orbax stores for ``arr`` and how to turn it back (``{}``: as is)."""
    dtype = np.dtype(arr.dtype)
    if not isinstance(arr, np.ndarray):  # a jax.Array: keep it on its devices when possible
        if dtype in native:
            return arr, {}
        if dtype == np.bool_:
            return arr.astype(np.uint8), {"as": "bool"}
        arr = host_array(arr)  # a rare dtype tensorstore lacks: stored as raw bytes
    layout: dict[str, str] = {"order": "F"} if _fortran(arr) else {}
    if dtype in native:
        return (np.ascontiguousarray(arr) if layout else arr), layout
    raw = np.ascontiguousarray(arr).view(np.uint8).reshape((*arr.shape, dtype.itemsize))
    return raw, {**layout, "as": "bytes"}


def _from_storage(stored: Any, layout: Mapping[str, str], dtype: np.dtype, placement: Any) -> Any:
    kind = layout.get("as")
    if kind == "bool":
        # A view keeps the exact bytes (JAX can hold non-canonical booleans).
        out = stored.view(np.bool_) if isinstance(stored, np.ndarray) else stored.astype(np.bool_)
    elif kind == "bytes":
        host = np.ascontiguousarray(stored)
        out = host.view(dtype).reshape(host.shape[:-1])
    else:
        out = stored
    if layout.get("order") == "F" and isinstance(out, np.ndarray):
        out = np.asfortranarray(out)
    if placement is not None and isinstance(out, np.ndarray):
        out = place(out, placement)
    return out


def _storage_form(arrays: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    native = _native()
    stored: dict[str, Any] = {}
    layouts: dict[str, dict[str, str]] = {}
    for key, arr in arrays.items():
        if math.prod(arr.shape) * np.dtype(arr.dtype).itemsize == 0:
            continue  # orbax refuses empty arrays; the manifest alone rebuilds them
        stored[key], layout = _to_storage(arr, native)
        if layout:
            layouts[key] = layout
    return stored, layouts


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


def _processes() -> Any:
    """Orbax's multiprocessing options naming every process.

    Without ``active_processes``, orbax's barriers are device collectives that
    wait forever for a process that never comes; with it, they go through
    jax.distributed's client and end after orbax's coordination timeout.
    """
    import jax

    ocp = _ocp()
    if jax.process_count() == 1:
        return ocp.options.MultiprocessingOptions()
    return ocp.options.MultiprocessingOptions(active_processes=set(range(jax.process_count())))


#: Bytes of device-to-host copies a blocking save of arrays on accelerators holds at
#: once (orbax's ``save_device_host_concurrent_bytes``); an array larger than this is
#: copied alone, and its shards are written before the next arrays are copied.
HOST_BUDGET = 512 << 20

#: Private switch for tests and measurements: budget arrays on CPU devices too (there,
#: "copying" a shard to the host is a view of it, so the budget only slows the save).
_BUDGET_ON_CPU = False


def _host_budget(arrays: Mapping[str, Any]) -> int | None:
    """Orbax's device-to-host byte limit for a blocking save of ``arrays``; ``None`` when
    every array already lies in host memory.

    Without it, orbax copies every array to the host before it writes any, so the
    host holds the whole model (2.8x it at the peak, measured on a GPU, issue 35).
    With it, arrays are copied in batches of ``HOST_BUDGET`` bytes (an array larger
    than that alone), each batch written, and its copies let go, before the next.
    """
    jax_arrays = [a for a in arrays.values() if not isinstance(a, np.ndarray)]
    on_host = all(d.platform == "cpu" for a in jax_arrays for d in a.sharding.device_set)
    if not jax_arrays or (on_host and not _BUDGET_ON_CPU):
        return None
    return HOST_BUDGET


def _handler(compression: str | None = None, target: Any = None, budget: int | None = None) -> Any:
    """Orbax's composite handler; array chunks are compressed only when asked for.

    zstd barely shrinks floating-point weights, and a compressed save keeps an
    encoded copy of each chunk on the host; uncompressed, tensorstore writes
    straight from the arrays' own buffers. ``None``: a handler for reading.
    ``budget``: see :func:`_host_budget`.
    """
    import jax

    ocp = _ocp()
    processes = _processes()
    options = ocp.CompositeOptions(
        multiprocessing_options=processes, temporary_path_class=temporary_path_class(target)
    )
    if compression is None:
        return ocp.CompositeCheckpointHandler(composite_options=options)
    # Process i alone writes item RECORD_ITEM + i (the others' arguments for it are unused).
    records = {
        f"{RECORD_ITEM}{i}": ocp.JsonCheckpointHandler(
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                primary_host=i, active_processes=processes.active_processes
            )
        )
        for i in range(jax.process_count())
    }
    return ocp.CompositeCheckpointHandler(
        composite_options=options,
        **records,
        **{
            MANIFEST_ITEM: ocp.JsonCheckpointHandler(multiprocessing_options=processes),
            STORAGE_ITEM: ocp.JsonCheckpointHandler(multiprocessing_options=processes),
            ARRAYS: ocp.PyTreeCheckpointHandler(
                use_compression=compression == "deflate",
                use_zarr3=True,  # one stored object per chunk (chunk_layout)
                multiprocessing_options=processes,
                # (orbax takes the budget in GB, 10**9 bytes; its write limit stays 96 GB)
                **({} if budget is None else {"save_device_host_concurrent_gb": budget / 1e9}),
            ),
        },
    )


def _checkpointer(handler: Any, target: Any, *, background: bool = False) -> Any:
    """Orbax's checkpointer: every process named, waits bounded by ``sync_timeout()``."""
    ocp = _ocp()
    if not background:
        return ocp.Checkpointer(
            handler,
            multiprocessing_options=_processes(),
            temporary_path_class=temporary_path_class(target),
        )
    return ocp.AsyncCheckpointer(
        handler,
        async_options=ocp.options.AsyncOptions(timeout_secs=max(1, round(sync_timeout()))),
        multiprocessing_options=_processes(),
        temporary_path_class=temporary_path_class(target),
    )


def _save_args(
    manifest: bytes, arrays: Mapping[str, Any], data_file_bytes: int, chunk_bytes: int
) -> Any:
    import jax

    ocp = _ocp()
    try:
        document = json.loads(manifest)
    except ValueError as err:  # pragma: no cover - export always gives JSON
        raise SerializationError(f"the manifest is not JSON ({err})") from None
    stored, layouts = _storage_form(arrays)
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


_crc = json_crc  # the name tests/orbax/_reseal.py imports


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
        handler = _handler(compression, target, _host_budget(arrays))
        checkpointer = _checkpointer(handler, target)
        try:
            with chunk_layout(where), one_save_at_a_time():
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
        checkpointer = _checkpointer(_handler(compression, target), target, background=True)
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
        return OrbaxRemote(f"{MANIFEST_ITEM}/{_MANIFEST_FILE}")

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
            ours = (p / MANIFEST_ITEM / _MANIFEST_FILE).exists() and (
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
        file = p / MANIFEST_ITEM / _MANIFEST_FILE
        if not file.exists() and _plain.is_plain(p):
            return _plain.PlainOrbaxCheckpoint(p, limits, where)
        try:
            size = file.stat().length
        except FileNotFoundError:
            raise SerializationError(f"{where}: the jaxstruct manifest item is missing") from None
        if size > limits.max_manifest_bytes:
            raise SerializationError(
                f"{where}: the manifest is {size} bytes, more than max_manifest_bytes="
                f"{limits.max_manifest_bytes}; if you trust this file, pass a larger "
                "max_manifest_bytes="
            )
        manifest = file.read_bytes()
        if len(manifest) != size:
            raise SerializationError(f"{where}: the manifest changed while being read")
        layouts, shardings, names, sums = _read_storage(p, limits, where)
        check_unchanged(p, pinned, where)  # the two items may come from two exports
        if sums is None:  # a checkpoint of jaxstruct-orbax before 0.2: unchecked
            return _OrbaxCheckpoint(
                p, manifest, layouts, shardings, where, names=names, pinned=pinned
            )
        manifest_crc, processes = sums
        if json_crc(parse_json(manifest, where, "jaxstruct manifest item")) != manifest_crc:
            raise SerializationError(
                f"{where}: the jaxstruct manifest item does not match its checksum: the "
                "checkpoint is corrupt; restore it from a copy"
            )
        units = None if processes is None else _read_records(p, processes, limits, where)
        return _CheckedOrbaxCheckpoint(
            p, manifest, layouts, shardings, where, names=names, pinned=pinned, units=units
        )


def _read_records(p: Any, processes: int, limits: Limits, where: str) -> dict[str, Units]:
    """Every process's checksum record, each checked against its own CRC-32, merged:
    ``array key -> units``. A missing record is a corrupt checkpoint."""
    out: dict[str, Units] = {}
    for i in range(processes):
        name = f"{RECORD_ITEM}{i}"
        file = p / name / _MANIFEST_FILE
        try:
            size = file.stat().length
        except FileNotFoundError:
            raise SerializationError(
                f"{where}: the checksum record {name!r} (process {i} of {processes}) is "
                "missing: the checkpoint is incomplete; restore it from a copy"
            ) from None
        if size > limits.max_manifest_bytes:
            raise SerializationError(
                f"{where}: the checksum record {name!r} is {size} bytes, more than "
                f"max_manifest_bytes={limits.max_manifest_bytes}; if you trust this file, "
                "pass a larger max_manifest_bytes="
            )
        document = parse_json(file.read_bytes(), where, f"checksum record {name!r}")
        for key, units in parse_record(document, i, where, name).items():
            out.setdefault(key, []).extend(units)
    return out


_KINDS = frozenset({"bool", "bytes"})


def _read_storage(
    p: Any, limits: Limits, where: str
) -> tuple[
    dict[str, dict[str, str]],
    dict[str, SavedSharding | None] | None,
    dict[str, str] | None,
    tuple[int, int | None] | None,
]:
    """Read and check the ``storage`` item: how each non-native array was stored, how
    each was sharded, its name in the arrays item (``None`` for a checkpoint written
    before that record), and its checksums (:func:`_checked_sums`; ``None`` for a
    checkpoint written before checksums: its chunks carry none either).

    The item's own ``crc32`` is checked first, when it has one."""
    file = p / STORAGE_ITEM / _MANIFEST_FILE
    try:
        size = file.stat().length
    except FileNotFoundError:
        raise SerializationError(f"{where}: the jaxstruct storage item is missing") from None
    if size > limits.max_manifest_bytes:
        raise SerializationError(
            f"{where}: the storage item is {size} bytes, more than max_manifest_bytes="
            f"{limits.max_manifest_bytes}; if you trust this file, pass a larger "
            "max_manifest_bytes="
        )
    document = parse_json(file.read_bytes(), where, "jaxstruct storage item")
    sums = _checked_sums(document, where)
    layouts = document.get("arrays") if isinstance(document, dict) else None
    if document.get("version") != 1 if isinstance(document, dict) else True:
        raise SerializationError(f"{where}: unknown storage item version; upgrade jaxstruct-orbax")
    if not isinstance(layouts, dict):
        raise SerializationError(f"{where}: the storage item has no 'arrays' mapping")
    for key, layout in layouts.items():
        if (
            not isinstance(layout, dict)
            or not set(layout) <= {"as", "order"}
            or layout.get("as", "bytes") not in _KINDS
            or layout.get("order", "F") != "F"
        ):
            raise SerializationError(f"{where}: malformed storage entry for array {key!r}")
    names = _names.check_names(document.get("names"), where)
    found = document.get("shardings")
    if found is None:
        return layouts, None, names, sums
    if not isinstance(found, dict):
        raise SerializationError(f"{where}: the storage item's 'shardings' is not a mapping")
    shardings = {key: sharding_from_json(value, key, where) for key, value in found.items()}
    return layouts, shardings, names, sums


def _checked_sums(document: Any, where: str) -> tuple[int, int | None] | None:
    """``(the manifest's CRC-32, how many processes recorded unit checksums)`` from a
    storage item whose own CRC-32 matches; ``None`` when the item has no checksums (an
    older checkpoint). The count is ``None`` for a checkpoint of jaxstruct-orbax 0.1
    whose chunks carry zarr's ``crc32c`` codec instead (tensorstore checks those)."""
    if not isinstance(document, dict) or "crc32" not in document:
        return None
    if document["crc32"] != json_crc(document):
        raise SerializationError(
            f"{where}: the jaxstruct storage item does not match its checksum: the checkpoint "
            "is corrupt; restore it from a copy"
        )
    sums = document.get("manifest_crc32")
    checksums = document.get("checksums")
    processes = checksums.get("processes") if isinstance(checksums, dict) else None
    if type(sums) is not int:
        pass
    elif checksums is None and document.get("chunks") == "crc32c":
        return sums, None
    elif (
        isinstance(checksums, dict)
        and checksums.get("units") == "crc32"
        and type(processes) is int
        and processes > 0
    ):
        return sums, processes
    raise SerializationError(f"{where}: the storage item's checksums are malformed")


def _host_safe(arrays: Mapping[str, Any]) -> dict[str, Any]:
    """NumPy inputs copied (the caller may mutate them once the call returns)."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in arrays.items()}


class _OrbaxCheckpoint(OpenedCheckpoint):
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
        # What protects the stored bytes, as jaxstruct.io.inspect reports it.
        self.checksum_scheme = "none: written by jaxstruct-orbax before checksums"
        if isinstance(self, _CheckedOrbaxCheckpoint):
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
        ocp = _ocp()
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
                raise ValueError(
                    f"array {key!r} holds {store.dtype} {tuple(store.shape)}, "
                    f"orbax's metadata said {dtype} {tuple(shape)}"
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
        _ocp()
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
        """Arrays wanted as NumPy (or stored as raw bytes), unit by unit, each checked."""
        _ocp()
        try:
            jobs, pace = self._jobs(dict.fromkeys(to_read), storage)
            hosts = read_into_host(jobs, pace)
        except SerializationError:
            raise
        except Exception as err:
            raise self._read_failure(err) from None
        return {
            key: _from_storage(
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
        """Arrays wanted as NumPy (or stored as raw bytes): through orbax's restore, or
        unit by unit where the checkpoint records units."""
        if self.units is not None:
            return self._read_units_on_host(to_read, storage, table)
        ocp = _ocp()
        item: dict[str, Any] = {}
        restore_args: dict[str, Any] = {}
        for key in to_read:
            _, dtype = storage[key]
            item[self._name(key)] = np.empty((0,), dtype)  # structure only; restored as NumPy
            restore_args[self._name(key)] = ocp.RestoreArgs(restore_type=np.ndarray, dtype=dtype)
        if self.names is not None:
            item, restore_args = _names.nest(item), _names.nest(restore_args)
        checkpointer = _checkpointer(_handler(None, self.path), self.path)
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
            key: _from_storage(
                restored[self._name(key)],
                self.layouts.get(key, {}),
                np.dtype(table[key][0]),
                placement,
            )
            for key, placement in to_read.items()
        }


class _CheckedOrbaxCheckpoint(_OrbaxCheckpoint):
    """A checkpoint with checksums: a CRC-32 per stored unit that every read checks
    (``units``), or, written by jaxstruct-orbax 0.1, a CRC-32C per chunk that
    tensorstore checks."""

    def verify(self, table: Mapping[str, ArraySpec]) -> list[str]:
        """Read (and so check) every array, one at a time; one message per bad array."""
        problems = []
        for key in table:
            try:
                self.read_arrays(table, {key: None})
            except SerializationError as err:
                problems.append(f"array {key!r}: {err}")
        return problems


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
    return SerializationError(f"{where}: orbax could not read the arrays ({text})")
