"""jaxstruct's own checksums of a format's arrays: a CRC-32 of every piece, made and checked.

A format that does not check every stored byte itself (``Format.checks_arrays`` is
false: a plugin written from the docs' minimum) gets its arrays checked by jaxstruct:
at export, the CRC-32 of every *piece* of every array is computed and recorded in the
manifest's ``checksums`` section (covered by the manifest's seal); at load, every array
``read_arrays`` returns is checked against them before the value reaches the caller,
whatever was read (whole, ``select=``, sharded, into a target).

Pieces are a property of the array, not of how it is held: its C-order bytes cut into
boxes of at most ``piece`` bytes (1 MiB) — runs of rows, or runs inside one row where a
row is larger — so any holder computes the same CRCs: a NumPy array in any memory
order, a ``jax.Array`` from its shards on any sharding. A process holding only part of
a piece (a multi-process run) computes the CRC of the piece with what it does not hold
as zeros; CRC-32 is affine, so the pieces' CRCs come from those of every process by
XOR (``crc(a ^ b ^ c) = crc(a) ^ crc(b) ^ crc(c)`` for three inputs of equal length).

Arrays in host memory (NumPy, CPU devices) are read in place. An array in accelerator
memory is never copied to the host whole: its bytes are streamed in C order, a few
regions at a time within the process's host budget (``JAXSTRUCT_HOST_BUDGET``, as an
export's writer streams them), and each piece, a contiguous run of that stream, is
summed as it passes.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from jaxstruct.registry import SerializationError

# zlib-ng's CRC-32 runs several times faster than zlib's and releases the GIL.
from zlib_ng.zlib_ng import crc32

from . import _host, _multihost, _process

#: The piece size this code writes.
PIECE = 1 << 20
#: Pieces of one array CRC'd per task on the worker pool.
_PIECES_PER_TASK = 16

Box = tuple[tuple[int, int], ...]  # (start, stop) per dimension


def pieces(shape: tuple[int, ...], itemsize: int, piece: int = PIECE) -> list[Box]:
    """Cut an array of ``shape`` into its checksummed pieces, in C order.

    A piece is a box of at most ``piece`` bytes (unless one element is larger): the
    leading dimensions fixed, a range along the next one, the rest whole. The
    definition is part of the checkpoint layout (docs/io.md): never change it.

    Example:
        >>> pieces((4, 3), 4, piece=24)
        [((0, 2), (0, 3)), ((2, 4), (0, 3))]
    """
    out: list[Box] = []
    if not shape:
        return [()]

    def walk(prefix: Box) -> None:
        k = len(prefix)
        rest = shape[k + 1 :]
        unit = math.prod(rest) * itemsize  # bytes of one step along dimension k
        n = shape[k]
        if unit <= piece or not rest:
            step = n if unit * n <= piece else max(1, piece // max(unit, 1))
            whole = tuple((0, m) for m in rest)
            out.extend((*prefix, (a, min(n, a + step)), *whole) for a in range(0, n, step or 1))
        else:
            for i in range(n):
                walk((*prefix, (i, i + 1)))

    walk(())
    return out


def _as_bytes(block: np.ndarray) -> memoryview:
    """The C-order bytes of ``block`` (a view when it is C-contiguous, else a copy)."""
    return memoryview(np.ascontiguousarray(block).reshape(-1).view(np.uint8))  # pyright: ignore[reportArgumentType]  # numpy stubs lack __buffer__


def _slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


class _Holder:
    """The blocks of one array this process holds, as host arrays: ``(box, block)``."""

    def __init__(self, blocks: list[tuple[Box, np.ndarray]], complete: bool) -> None:
        self.blocks = blocks
        self.complete = complete  # whether the blocks cover the whole array

    def crc(self, box: Box, itemsize: int) -> int | None:
        """The CRC-32 of piece ``box`` (what is not held read as zeros), or ``None`` when
        nothing of it is held."""
        if len(self.blocks) == 1 and self.complete:
            return crc32(_as_bytes(self.blocks[0][1][_slices(box)]))
        parts: list[tuple[Box, np.ndarray]] = []
        for where, block in self.blocks:
            common = tuple(
                (max(a, c), min(b, d)) for (a, b), (c, d) in zip(box, where, strict=True)
            )
            if all(a < b for a, b in common):
                local = tuple((a - c, b - c) for (a, b), (c, _) in zip(common, where, strict=True))
                parts.append((common, block[_slices(local)]))
        if not parts:
            return None
        if len(parts) == 1 and parts[0][0] == box:
            return crc32(_as_bytes(parts[0][1]))
        shape = tuple(b - a for a, b in box)
        scratch = np.zeros(shape, parts[0][1].dtype)
        for common, part in parts:
            scratch[
                _slices(tuple((a - s, b - s) for (a, b), (s, _) in zip(common, box, strict=True)))
            ] = part
        return crc32(_as_bytes(scratch))


def _held_blocks(arr: Any) -> dict[Box, Any]:
    """The blocks of the ``jax.Array`` ``arr`` this process holds, by box: every distinct
    shard where it holds all of ``arr``, else those whose ``replica_id`` is 0 (so that
    across the processes every element is counted once)."""
    complete = bool(arr.is_fully_addressable)
    seen: dict[Box, Any] = {}
    for shard in arr.addressable_shards:
        if not complete and shard.replica_id != 0:
            continue
        box = tuple(
            (s.start or 0, n if s.stop is None else s.stop)
            for s, n in zip(shard.index, arr.shape, strict=False)
        )
        box = box + tuple((0, n) for n in arr.shape[len(box) :])
        seen.setdefault(box, shard.data)
    return seen


def _holder(arr: Any) -> _Holder:
    """What this process holds of ``arr`` (a NumPy array or a ``jax.Array`` in host
    memory), viewed in place."""
    if not hasattr(arr, "addressable_shards"):  # NumPy (or a NumPy scalar)
        arr = np.asarray(arr)
        return _Holder([(tuple((0, n) for n in arr.shape), arr)], True)
    seen = _held_blocks(arr)
    datas = [np.asarray(d) for d in seen.values()]
    return _Holder(list(zip(seen, datas, strict=True)), bool(arr.is_fully_addressable))


def _size(box: Box, itemsize: int) -> int:
    return math.prod(b - a for a, b in box) * itemsize


def _runs(stream: Iterator[memoryview], sizes: Sequence[int]) -> Iterator[Iterator[memoryview]]:
    """Cut ``stream`` (consecutive bytes) into consecutive runs of ``sizes`` bytes: for
    each, an iterator of its parts, to be consumed before the next run is asked for (a
    part is a view of the stream's current chunk, which is let go of as the run moves
    on, so that no more than the stream's own regions is held)."""
    chunks = iter(stream)
    view = _EMPTY

    def run(left: int) -> Iterator[memoryview]:
        nonlocal view
        while left:
            if not view.nbytes:
                view = next(chunks)
                continue
            take = min(left, view.nbytes)
            yield view[:take]
            view, left = view[take:], left - take
            if not view.nbytes:
                view = _EMPTY  # an empty slice would keep the chunk it was cut from

    for size in sizes:
        yield run(size)


_EMPTY = memoryview(b"")


def _streamed_crcs(
    name: str, blocks: list[_host.Block], shape: tuple[int, ...], dtype: np.dtype, piece: int
) -> list[int | None]:
    """The CRC-32 of every piece of an array this process holds entirely (``blocks`` tile
    it) in accelerator memory: its bytes streamed in C order within the host budget, each
    piece a contiguous run of them, summed as it passes."""
    sizes = [_size(box, dtype.itemsize) for box in pieces(shape, dtype.itemsize, piece)]
    if not sum(sizes):
        return [0] * len(sizes)  # the CRC-32 of no bytes
    stream = _host.pieces(name, blocks, shape, dtype)
    out: list[int | None] = []
    try:
        for parts in _runs(stream, sizes):
            crc = 0
            for part in parts:
                crc = crc32(part, crc)
            out.append(crc)
    finally:
        stream.close()
    return out


def _streamed_part_crcs(
    name: str, blocks: Mapping[Box, Any], shape: tuple[int, ...], dtype: np.dtype, piece: int
) -> list[int | None]:
    """:meth:`_Holder.crc` of every piece for the ``blocks`` of an array in accelerator
    memory that this process holds a part of (a multi-process run): each block's bytes
    streamed in C order within the host budget, one block at a time.

    A piece cuts a block in a box that is one contiguous run of the block's C-order
    bytes (a piece spans whole trailing dimensions, and is fixed in the leading ones),
    and the pieces' runs follow one another there in the pieces' order. Each run is
    placed in a zeroed piece (at most two pieces of host memory besides the stream) and
    its CRC-32 taken; the parts of a piece from several blocks merge as the processes'
    parts do.
    """
    itemsize = dtype.itemsize
    boxes = pieces(shape, itemsize, piece)
    found: list[list[int]] = [[] for _ in boxes]
    for where, data in blocks.items():
        cuts: list[tuple[int, Box]] = []  # (piece, its box inside the piece)
        for i, box in enumerate(boxes):
            common = tuple(
                (max(a, c), min(b, d)) for (a, b), (c, d) in zip(box, where, strict=True)
            )
            if all(a < b for a, b in common):
                inside = tuple((a - s, b - s) for (a, b), (s, _) in zip(common, box, strict=True))
                cuts.append((i, inside))
        if not cuts:
            continue
        local = tuple((0, b - a) for a, b in where)
        stream = _host.pieces(name, [(local, data)], tuple(b - a for a, b in where), dtype)
        try:
            runs = _runs(stream, [_size(inside, itemsize) for _, inside in cuts])
            for (i, inside), parts in zip(cuts, runs, strict=True):
                whole = boxes[i]
                scratch = np.zeros((*(b - a for a, b in whole), itemsize), np.uint8)
                run = np.concatenate([np.frombuffer(p, np.uint8) for p in parts])
                scratch[_slices(inside)] = run.reshape(*(b - a for a, b in inside), itemsize)
                found[i].append(crc32(_as_bytes(scratch)))
                del scratch, run
        finally:
            stream.close()
    return [
        None if not parts else merge(parts, _size(box, itemsize)) if len(parts) > 1 else parts[0]
        for parts, box in zip(found, boxes, strict=True)
    ]


#: Bytes of pieces one task of the worker pool checksums (whole pieces, of any arrays).
_TASK_BYTES = _PIECES_PER_TASK * PIECE


def _host_crcs(
    holders: Mapping[str, _Holder],
    specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
    piece: int,
) -> dict[str, list[int | None]]:
    """The CRC-32 of every piece of every array held in host memory, all arrays at once:
    consecutive pieces (of one array or several) in tasks of about ``_TASK_BYTES`` on the
    worker pool, so that many arrays of a few pieces each keep every core busy too, and
    a checkpoint of at most one task's bytes costs no hand-over to a thread."""
    items: list[tuple[str, Box, int]] = []  # (key, piece, itemsize), in order
    for key in holders:
        dtype, shape = specs[key]
        items.extend((key, box, dtype.itemsize) for box in pieces(shape, dtype.itemsize, piece))

    def run(batch: list[tuple[str, Box, int]]) -> list[int | None]:
        return [holders[key].crc(box, itemsize) for key, box, itemsize in batch]

    batches: list[list[tuple[str, Box, int]]] = [[]]
    size = 0
    for item in items:
        if size >= _TASK_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(item)
        size += max(_size(item[1], item[2]), 1)
    if len(batches) == 1:
        found = run(batches[0])
    else:
        futures = [_process.submit(_process.pool, lambda b=b: run(b)) for b in batches]
        found = [crc for future in futures for crc in future.result()]
    out: dict[str, list[int | None]] = {key: [] for key in holders}
    for (key, _, _), crc in zip(items, found, strict=True):
        out[key].append(crc)
    return out


def _device_crcs(
    key: str, arr: Any, dtype: np.dtype, shape: tuple[int, ...], piece: int
) -> list[int | None]:
    """The CRC-32s of the pieces of a ``jax.Array`` in accelerator memory (of what this
    process holds of it), its bytes brought to the host within the host budget."""
    name = f"{key} (shape {shape}, dtype {dtype})"
    if arr.is_fully_addressable:
        return _streamed_crcs(name, _host.blocks_of(name, arr), shape, dtype, piece)
    return _streamed_part_crcs(name, _held_blocks(arr), shape, dtype, piece)


@functools.lru_cache(maxsize=64)
def _zeros_crc(nbytes: int) -> int:
    """The CRC-32 of ``nbytes`` zero bytes."""
    block = bytes(min(nbytes, 1 << 16))
    crc = 0
    full, rest = divmod(nbytes, len(block) or 1)
    for _ in range(full):
        crc = crc32(block, crc)
    return crc32(block[:rest], crc)


def merge(parts: Sequence[int | None], nbytes: int) -> int:
    """The CRC-32 of a piece of ``nbytes`` from the CRC-32s of its parts, each the piece
    with what the others hold as zeros (``None``: a process holding none of it)."""
    zero = _zeros_crc(nbytes)
    crc = zero
    for part in parts:
        if part is not None:
            crc ^= part ^ zero
    return crc


def _crcs(
    name: str,
    arrays: Mapping[str, Any],
    specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
    where: str,
    piece: int,
) -> dict[str, list[int]]:
    """The CRC-32 of every piece of every array, one array at a time (a host copy of one
    array's shards at most); every process's parts merged where several hold an array.

    Whether to exchange is decided by the arrays alone (whether each is held entirely
    here: the same answer in every process), so every process calls the exchange or none.
    """
    partial: dict[str, list[int | None]] = {}
    shared: list[str] = []
    on_host: dict[str, _Holder] = {}
    for key, arr in arrays.items():
        if hasattr(arr, "addressable_shards") and _host.streams(arr):  # in accelerator memory
            partial[key] = _device_crcs(key, arr, *specs[key], piece)
            if not arr.is_fully_addressable:
                shared.append(key)
            continue
        on_host[key] = holder = _holder(arr)  # views in place: no copy is held
        if not holder.complete:
            shared.append(key)
    partial.update(_host_crcs(on_host, specs, piece))
    partial = {key: partial[key] for key in arrays}  # in the arrays' order
    out = {k: [c for c in crcs if c is not None] for k, crcs in partial.items() if k not in shared}
    if not shared:
        return out
    mine = {k: [("" if c is None else f"{c:08x}") for c in partial[k]] for k in shared}
    everyone = _multihost.gather(name, mine, path=where)
    for key in shared:
        dtype, shape = specs[key]
        out[key] = [
            merge(
                [int(p[key][i], 16) if p[key][i] else None for p in everyone],
                math.prod(b - a for a, b in box) * dtype.itemsize,
            )
            for i, box in enumerate(pieces(shape, dtype.itemsize, piece))
        ]
    return out


def checksum_arrays(arrays: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The manifest's ``checksums`` section for ``arrays`` (computed in every process of a
    multi-process run, together): the CRC-32 of every piece of every array."""
    specs = {key: (np.dtype(arr.dtype), tuple(arr.shape)) for key, arr in arrays.items()}
    crcs = _crcs("checksums", arrays, specs, where, PIECE)
    return {
        "by": "jaxstruct",
        "piece": PIECE,
        "crc32": {k: "".join(f"{c:08x}" for c in v) for k, v in crcs.items()},
    }


class Expected:
    """The CRC-32s a manifest records for its arrays, checked against what was read.

    ``names`` gives each array's tree path, for messages (called only on a failure).
    """

    def __init__(
        self,
        section: Mapping[str, Any],
        table: Mapping[str, Any],
        where: str,
        names: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        self.where = where
        self.names = names
        self.piece = int(section["piece"])
        stored = section["crc32"]
        if set(stored) != set(table):
            raise SerializationError(
                f"{where}: the manifest's checksums do not cover exactly its arrays; "
                "restore the checkpoint from a copy"
            )
        self.crcs: dict[str, str] = dict(stored)
        self.table = table
        for key, spec in table.items():
            count = len(pieces(tuple(spec.shape), np.dtype(spec.dtype).itemsize, self.piece))
            text = self.crcs[key]
            if len(text) != 8 * count or not _is_hex(text):
                raise SerializationError(
                    f"{where}: the manifest's checksums of array {key!r} are malformed "
                    f"(expected {count} CRC-32s); restore the checkpoint from a copy"
                )

    def check(self, arrays: Mapping[str, Any], who: str) -> None:
        """Raise naming the file, the array and the first bad piece unless every array of
        ``arrays`` has the recorded CRC-32s (every process checks its part, together);
        ``who`` names the format that read them."""
        specs = {k: (np.dtype(self.table[k].dtype), tuple(self.table[k].shape)) for k in arrays}
        found = _crcs("checksums-check", arrays, specs, self.where, self.piece)
        for key, crcs in found.items():
            text = self.crcs[key]
            boxes = pieces(specs[key][1], specs[key][0].itemsize, self.piece)
            for i, crc in enumerate(crcs):
                stored = int(text[8 * i : 8 * i + 8], 16)
                if crc != stored:
                    name = self.names().get(key, key)
                    raise SerializationError(
                        f"{self.where}: array {name!r} ({key}) does not match "
                        f"its checksum at piece {i} of {len(crcs)} (elements "
                        f"{_box_text(boxes[i])}; stored crc32 {stored:08x}, read {crc:08x}): "
                        f"the file was damaged after it was written, or {who} read it wrong; "
                        "restore the checkpoint from a copy"
                    )


def _box_text(box: Box) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


def _is_hex(text: str) -> bool:
    return _HEX.fullmatch(text) is not None


_HEX = re.compile(r"[0-9a-f]*")
