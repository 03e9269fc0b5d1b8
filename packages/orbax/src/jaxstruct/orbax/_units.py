"""The CRC-32 of every stored unit: computed on save, recorded per process, checked on read.

Each process cuts every shard it writes (its replica-0 shards of a
``jax.Array``; the whole of a NumPy array, in process 0 only) into *units*:
boxes of at most ``limit`` bytes that are contiguous byte ranges of the
shard in C order (one run of whole trailing rows along one axis, the axes
before it of length one). It records the CRC-32 of each unit in its own
JSON document (:func:`process_record`), saved as one orbax item per
process and carrying its own CRC-32. A restore reads every unit it needs
whole, checks its CRC-32, and only then copies it where it goes
(``_read``); the units of all processes must cover each array it reads.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeGuard

import numpy as np
from jaxstruct.io import host_chunks, map_on_workers
from jaxstruct.registry import SerializationError
from zlib_ng.zlib_ng import crc32

__all__ = [
    "RECORD_VERSION",
    "Box",
    "Units",
    "bytes_crc",
    "cut",
    "json_crc",
    "parse_record",
    "process_record",
    "unit_boxes",
]

RECORD_VERSION = 1

Box = tuple[tuple[int, int], ...]  # (start, stop) per dimension
Units = list[tuple[Box, int]]  # (unit box in the array, its CRC-32), one array's units


def json_crc(document: Any) -> int:
    """The CRC-32 of a JSON document in a canonical form (whatever bytes orbax wrote it as),
    leaving out its own ``crc32`` entry."""
    if isinstance(document, dict):
        document = {k: v for k, v in document.items() if k != "crc32"}
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return zlib.crc32(text.encode("ascii"))


def bytes_crc(data: np.ndarray) -> int:
    """The CRC-32 of ``data``'s bytes in C order (no copy when it is C-contiguous)."""
    flat = np.ascontiguousarray(data).reshape(-1)
    return crc32(flat.view(np.uint8))


def cut(shape: Sequence[int], itemsize: int, limit: int) -> tuple[int, int]:
    """``(axis, step)``: units of ``step`` indices along ``axis``, the axes after it whole,
    the axes before it one index at a time, at most ``limit`` bytes each. A scalar is one
    unit: ``(0, 1)``.

    ``step`` divides the length of ``axis`` when a divisor at least a quarter of the
    most that fits exists (the stored chunks are then these very units, see
    ``_orbax_internals.chunk_layout``); otherwise the last unit is shorter.
    """
    for axis in range(len(shape)):
        row = math.prod(shape[axis + 1 :]) * itemsize
        if row <= limit:
            most = max(1, min(shape[axis], limit // max(1, row)))
            best = _largest_divisor(shape[axis], most)
            return axis, best if 4 * best >= most else most
    return max(0, len(shape) - 1), 1


def _largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` (> 0) that is at most ``at_most``."""
    best = 1
    for i in range(1, math.isqrt(n) + 1):
        if n % i == 0:
            best = max([best, *(d for d in (i, n // i) if d <= at_most)])
    return best


def unit_boxes(box: Box, axis: int, step: int) -> Iterator[Box]:
    """The units of the shard ``box`` cut by ``(axis, step)``, in C order."""
    if not box:
        yield ()
        return
    heads = [range(lo, hi) for lo, hi in box[:axis]]
    lo, hi = box[axis]
    for head in _product(heads):
        for start in range(lo, hi, step):
            yield (
                *((i, i + 1) for i in head),
                (start, min(start + step, hi)),
                *box[axis + 1 :],
            )


def _product(ranges: Sequence[range]) -> Iterator[tuple[int, ...]]:
    if not ranges:
        yield ()
        return
    for first in ranges[0]:
        for rest in _product(ranges[1:]):
            yield (first, *rest)


def _count(box: Box, axis: int, step: int) -> int:
    """How many units ``unit_boxes(box, axis, step)`` gives, without listing them."""
    if not box:
        return 1
    lo, hi = box[axis]
    return math.prod(hi - lo for lo, hi in box[:axis]) * -(-(hi - lo) // step)


def _own_pieces(arr: Any, primary: bool) -> list[tuple[Box, Any]]:
    """The pieces of ``arr`` this process writes: ``(box, data)`` per replica-0 shard."""
    if isinstance(arr, np.ndarray):  # orbax writes a NumPy array from process 0 only
        return [(tuple((0, n) for n in arr.shape), arr)] if primary else []
    shape = tuple(arr.shape)
    out = []
    for shard in arr.addressable_shards:
        if shard.replica_id != 0:
            continue
        box = tuple(
            (s.start or 0, n if s.stop is None else s.stop)
            for s, n in zip(shard.index, shape, strict=True)
        )
        out.append((box, shard.data))
    return out


def _unit_crcs(data: Any, sizes: Iterator[int]) -> list[int]:
    """The CRC-32 of each consecutive run of ``sizes`` bytes of ``data``'s bytes in C order
    (a shard's units). On a CPU device, or as a NumPy array, the bytes are viewed in
    place; on an accelerator, copied to the host a piece at a time within jaxstruct's
    host budget (never the whole shard at once, never through the user's array)."""
    crcs: list[int] = []
    left, crc = next(sizes, 0), 0
    for chunk in host_chunks(data):
        view = memoryview(chunk)
        while view.nbytes:
            take = min(left, view.nbytes)
            crc = crc32(view[:take], crc)
            view, left = view[take:], left - take
            if not left:
                crcs.append(crc)
                left, crc = next(sizes, 0), 0
        del chunk, view  # counted against the budget until let go of
    return crcs


def process_record(stored: Mapping[str, Any], limit: int, process: int) -> dict[str, Any]:
    """This process's record: per stored array, per piece it writes, the CRC-32 of each unit.

    On CPU devices a shard's host view is its own buffer; on an accelerator
    each shard is copied to the host once more (beside orbax's own copy, which
    the record is written before), a piece at a time within the host budget.
    """
    shards: list[tuple[str, Box, int, int, Any, list[int]]] = []
    for key, arr in stored.items():
        itemsize = np.dtype(arr.dtype).itemsize
        for box, data in _own_pieces(arr, process == 0):
            axis, step = cut([hi - lo for lo, hi in box], itemsize, limit)
            # Each unit is a contiguous run of the shard's bytes in C order.
            sizes = [
                math.prod(hi - lo for lo, hi in u) * itemsize for u in unit_boxes(box, axis, step)
            ]
            shards.append((key, box, axis, step, data, sizes))
    # The shards' units on io's worker threads, every core at once (a save's blocking
    # part waits for them: the record is saved with the arrays).
    found = map_on_workers(lambda shard: _unit_crcs(shard[4], iter(shard[5])), shards)
    arrays: dict[str, list[dict[str, Any]]] = {}
    for (key, box, axis, step, _, _), crcs in zip(shards, found, strict=True):
        piece = {"box": [list(b) for b in box], "axis": axis, "step": step, "crcs": crcs}
        arrays.setdefault(key, []).append(piece)
    record: dict[str, Any] = {"version": RECORD_VERSION, "process": process, "arrays": arrays}
    record["crc32"] = json_crc(record)
    return record


def _int(value: Any) -> TypeGuard[int]:
    return type(value) is int and value >= 0


def _box(value: Any) -> Box | None:
    if not isinstance(value, list) or not all(
        isinstance(b, list) and len(b) == 2 and _int(b[0]) and _int(b[1]) and b[0] < b[1]
        for b in value
    ):
        return None
    return tuple((b[0], b[1]) for b in value)


def _piece(piece: Any) -> Units | None:
    """The units of one recorded piece and their CRC-32s; ``None`` when malformed."""
    if not isinstance(piece, dict):
        return None
    box = _box(piece.get("box"))
    axis, step, crcs = piece.get("axis"), piece.get("step"), piece.get("crcs")
    if box is None or not _int(axis) or not _int(step) or not isinstance(crcs, list):
        return None
    if step == 0 or axis >= max(1, len(box)) or _count(box, axis, step) != len(crcs):
        return None
    if not all(_int(c) and c < 1 << 32 for c in crcs):
        return None
    return list(zip(unit_boxes(box, axis, step), crcs, strict=True))


def parse_record(document: Any, process: int, where: str, name: str) -> dict[str, Units]:
    """Check one process's record (its CRC-32 first) and return ``key -> units``."""
    if not isinstance(document, dict) or document.get("crc32") != json_crc(document):
        raise SerializationError(
            f"{where}: the checksum record {name!r} does not match its own checksum: the "
            "checkpoint is corrupt; restore it from a copy"
        )
    arrays = document.get("arrays")
    if (
        document.get("version") != RECORD_VERSION
        or document.get("process") != process
        or not isinstance(arrays, dict)
    ):
        raise SerializationError(f"{where}: the checksum record {name!r} is malformed")
    out: dict[str, Units] = {}
    for key, pieces in arrays.items():
        units: Units = []
        for piece in pieces if isinstance(pieces, list) else [None]:
            found = _piece(piece)
            if found is None:
                raise SerializationError(
                    f"{where}: the checksum record {name!r} is malformed (array {key!r})"
                )
            units.extend(found)
        out[key] = units
    return out
