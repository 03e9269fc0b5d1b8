"""The items of a ``format="orbax"`` checkpoint: their names, the orbax handlers and
checkpointers that write and read them, how each array is stored, and the jaxstruct
items (storage record, per-process checksum records) read back and checked."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from jaxstruct.io import Limits, SavedSharding, host_array, parse_json, place, sync_timeout
from jaxstruct.registry import SerializationError

from . import _names
from ._orbax_internals import batched_transfers
from ._shardmeta import sharding_from_json
from ._stores import temporary_path_class
from ._units import Units, json_crc, parse_record

__all__ = [
    "ARRAYS",
    "CORRUPT",
    "MANIFEST_FILE",
    "MANIFEST_ITEM",
    "RECORD_ITEM",
    "STORAGE_ITEM",
    "from_storage",
    "make_checkpointer",
    "make_handler",
    "native_dtypes",
    "orbax_checkpoint",
    "parse_item",
    "process_options",
    "read_item",
    "read_records",
    "read_storage",
    "storage_form",
    "to_storage",
]

ARRAYS = "arrays"
MANIFEST_ITEM = "jaxstruct"
STORAGE_ITEM = "jaxstruct_storage"
#: Each process's record of the CRC-32s of the units it wrote (``_units``): item ``<this><i>``.
RECORD_ITEM = "jaxstruct_checksums_"
MANIFEST_FILE = "metadata"  # the JSON handler's default file name


def orbax_checkpoint() -> Any:
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


def native_dtypes() -> frozenset[np.dtype]:
    import ml_dtypes

    names = [np.dtype(n) for n in _NATIVE_NAMES]
    names += [np.dtype(getattr(ml_dtypes, n)) for n in _NATIVE_ML if hasattr(ml_dtypes, n)]
    return frozenset(names)


def _fortran(arr: np.ndarray) -> bool:
    return arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous


def to_storage(arr: Any, native: frozenset[np.dtype]) -> tuple[Any, dict[str, str]]:
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


def from_storage(stored: Any, layout: Mapping[str, str], dtype: np.dtype, placement: Any) -> Any:
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


def storage_form(arrays: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    native = native_dtypes()
    stored: dict[str, Any] = {}
    layouts: dict[str, dict[str, str]] = {}
    for key, arr in arrays.items():
        if math.prod(arr.shape) * np.dtype(arr.dtype).itemsize == 0:
            continue  # orbax refuses empty arrays; the manifest alone rebuilds them
        stored[key], layout = to_storage(arr, native)
        if layout:
            layouts[key] = layout
    return stored, layouts


def read_item(file: Any, limits: Limits, where: str, what: str, *, missing: str) -> bytes:
    """The bytes of the JSON item ``file`` (``what`` in messages), refused above
    ``max_manifest_bytes`` before it is read; ``missing`` says why its absence is wrong."""
    try:
        size = file.stat().length
    except FileNotFoundError:
        raise SerializationError(f"{where}: {missing}") from None
    if size > limits.max_manifest_bytes:
        raise SerializationError(
            f"{where}: {what} is {size} bytes, more than max_manifest_bytes="
            f"{limits.max_manifest_bytes}; if you trust this file, pass a larger "
            "max_manifest_bytes="
        )
    data = file.read_bytes()
    if len(data) != size:
        raise SerializationError(f"{where}: {what} changed while being read")
    return data


#: What to do about a damaged item.
CORRUPT = ": the checkpoint is corrupt; restore it from a copy"


def parse_item(data: bytes, where: str, what: str) -> Any:
    """The JSON of one of jaxstruct's items (strictly, :func:`jaxstruct.io.parse_json`); a
    malformed one is a corrupt checkpoint."""
    try:
        return parse_json(data, where, what)
    except SerializationError as err:
        raise SerializationError(f"{err}{CORRUPT}") from None


def read_records(p: Any, processes: int, limits: Limits, where: str) -> dict[str, Units]:
    """Every process's checksum record, each checked against its own CRC-32, merged:
    ``array key -> units``. A missing record is a corrupt checkpoint."""
    out: dict[str, Units] = {}
    for i in range(processes):
        name = f"{RECORD_ITEM}{i}"
        data = read_item(
            p / name / MANIFEST_FILE,
            limits,
            where,
            f"the checksum record {name!r}",
            missing=f"the checksum record {name!r} (process {i} of {processes}) is "
            "missing: the checkpoint is incomplete; restore it from a copy",
        )
        document = parse_item(data, where, f"checksum record {name!r}")
        for key, units in parse_record(document, i, where, name).items():
            out.setdefault(key, []).extend(units)
    return out


_KINDS = frozenset({"bool", "bytes"})


def read_storage(
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
    data = read_item(
        p / STORAGE_ITEM / MANIFEST_FILE,
        limits,
        where,
        "the storage item",
        missing="the jaxstruct storage item is missing",
    )
    document = parse_item(data, where, "jaxstruct storage item")
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


#: The storage item's keys that say the checkpoint was saved with checksums: its own
#: CRC-32, the manifest's, and how the arrays are checked (``checksums``; ``chunks`` in a
#: checkpoint of jaxstruct-orbax 0.1). A flipped bit renames one key at most, so any one
#: of them left (or a key one bit away from one) demands the others.
_MARKS = ("crc32", "manifest_crc32", "checksums", "chunks")
_MARK_NAMES = tuple(name.encode() for name in _MARKS)


def _one_bit_from(key: str, name: bytes) -> bool:
    """Whether ``key`` is ``name`` with exactly one bit flipped."""
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) != len(name):
        return False
    return sum((a ^ b).bit_count() for a, b in zip(raw, name, strict=True)) == 1


def _marks(document: dict[str, Any]) -> list[str]:
    """The keys of the storage item that say it was saved with checksums (see ``_MARKS``)."""
    return [k for k in document if k in _MARKS or any(_one_bit_from(k, n) for n in _MARK_NAMES)]


def _checked_sums(document: Any, where: str) -> tuple[int, int | None] | None:
    """``(the manifest's CRC-32, how many processes recorded unit checksums)`` from a
    storage item whose own CRC-32 matches; ``None`` when the item has no checksums and no
    mark of them (a checkpoint of jaxstruct-orbax before checksums). The count is ``None``
    for a checkpoint of jaxstruct-orbax 0.1 whose chunks carry zarr's ``crc32c`` codec
    instead (tensorstore checks those)."""
    if not isinstance(document, dict):
        return None
    found = _marks(document)
    if not found:
        return None
    if "crc32" not in document:
        raise SerializationError(
            f"{where}: the jaxstruct storage item says the checkpoint was saved with "
            f"checksums (it holds {found[0]!r}), but its own CRC-32 ('crc32') is missing or "
            "renamed: the checkpoint is corrupt; restore it from a copy"
        )
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
    raise SerializationError(
        f"{where}: the storage item's checksums are malformed: the checkpoint is corrupt; "
        "restore it from a copy"
    )


def process_options() -> Any:
    """Orbax's multiprocessing options naming every process.

    Without ``active_processes``, orbax's barriers are device collectives that
    wait forever for a process that never comes; with it, they go through
    jax.distributed's client and end after orbax's coordination timeout.
    """
    import jax

    ocp = orbax_checkpoint()
    if jax.process_count() == 1:
        return ocp.options.MultiprocessingOptions()
    return ocp.options.MultiprocessingOptions(active_processes=set(range(jax.process_count())))


def make_handler(
    compression: str | None = None, target: Any = None, budget: int | None = None
) -> Any:
    """Orbax's composite handler; array chunks are compressed only when asked for.

    zstd barely shrinks floating-point weights, and a compressed save keeps an
    encoded copy of each chunk on the host; uncompressed, tensorstore writes
    straight from the arrays' own buffers. ``None``: a handler for reading.
    ``budget``: the bytes of device-to-host copies a blocking save may hold at once
    (``_format._host_budget``): arrays are then copied in batches within it, each
    written before the next is copied (``batched_transfers``); ``None``: orbax's default.
    """
    import jax

    ocp = orbax_checkpoint()
    processes = process_options()
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
                **(
                    {}
                    if budget is None
                    else {
                        "save_device_host_concurrent_gb": budget / 1e9,
                        "type_handler_registry": batched_transfers(),
                    }
                ),
            ),
        },
    )


def make_checkpointer(handler: Any, target: Any, *, background: bool = False) -> Any:
    """Orbax's checkpointer: every process named, waits bounded by ``sync_timeout()``."""
    ocp = orbax_checkpoint()
    if not background:
        return ocp.Checkpointer(
            handler,
            multiprocessing_options=process_options(),
            temporary_path_class=temporary_path_class(target),
        )
    return ocp.AsyncCheckpointer(
        handler,
        async_options=ocp.options.AsyncOptions(timeout_secs=max(1, round(sync_timeout()))),
        multiprocessing_options=process_options(),
        temporary_path_class=temporary_path_class(target),
    )
