"""A zip writer that deflates members in parallel.

The standard library's :mod:`zipfile` compresses one member at a time on one
core and cannot take data that is already compressed, so members are written
here: each member's CRC and (optional) DEFLATE stream are computed on a thread
pool (``zlib`` releases the GIL), and the main thread writes finished members
in order. The output is an ordinary zip (ZIP64 when needed) that
:mod:`zipfile` and ``numpy.load`` read. Reading is :mod:`._zipread`'s job.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import BinaryIO

from ._crc import crc32, crc32_combine
from ._pools import WORKERS, pool

__all__ = ["Chunk", "Member", "write_zip"]

_STORED, _DEFLATED = 0, 8
_ZIP64_LIMIT = 0xFFFFFFFF
_DOS_DATE = (1 << 5) | 1  # 1980-01-01: fixed timestamps make exports reproducible.
_SAMPLE = 8 * 1024
_AUTO_RATIO = 0.85
_CHUNK = 4 << 20

# Below this many bytes in all, members are prepared on the calling thread:
# handing tiny members to threads costs more than it saves.
_PARALLEL_BYTES = 1 << 20
# Members smaller than this are prepared on the calling thread even then.
_INLINE = 64 << 10
# Pieces smaller than this are gathered in a buffer of about _BUFFER bytes
# before they are written; larger ones are written straight from the caller's memory.
_DIRECT_WRITE = 64 << 10
_BUFFER = 1 << 20
# compression="auto" stores members smaller than this: DEFLATE's setup costs
# more than the few bytes it could save.
_TINY = 4096

Chunk = bytes | memoryview


@dataclasses.dataclass
class Member:
    """One member to write: its name, its size and its content as chunks.

    ``chunks`` is called once per pass over the content and yields byte
    chunks (views of the caller's arrays where possible, never one copy of a
    whole sharded array). ``sample`` is a few KiB of the content used to decide
    whether compressing pays (``None``: taken from ``parts`` when given, else
    from the first chunks); it is only taken when compression is considered.
    """

    name: str
    size: int
    chunks: Callable[[], Iterable[Chunk]]
    text: bool = False  # JSON: compress with the default strategy.
    sample: bytes | None = None

    parts: Sequence[Chunk] | None = None  # the content, when it is already in memory

    @classmethod
    def of(cls, name: str, parts: Sequence[Chunk], *, text: bool = False) -> Member:
        """A member made of ``parts`` already in memory."""
        return cls(name, sum(len(p) for p in parts), lambda: parts, text=text, parts=parts)


@dataclasses.dataclass
class _Prepared:
    crc: int  # of the member's content
    size: int
    method: int
    payload: Sequence[Chunk] | None  # None: stream the content again (stored members)
    csize: int
    payload_crc: int  # of the bytes written to the archive (= crc when stored)


def _sample(parts: Sequence[Chunk]) -> bytes:
    total = sum(len(p) for p in parts)
    if total <= 3 * _SAMPLE:
        return b"".join(bytes(p) for p in parts)
    data = parts[-1]
    n = len(data)
    if n < 3 * _SAMPLE:
        return bytes(data[:_SAMPLE])
    return b"".join(bytes(data[i : i + _SAMPLE]) for i in (0, (n - _SAMPLE) // 2, n - _SAMPLE))


def _deflate_all(chunks: Iterable[Chunk], strategy: int, level: int) -> tuple[int, list[bytes]]:
    """Return the CRC of ``chunks`` and their raw DEFLATE stream, in one pass."""
    comp = zlib.compressobj(level, zlib.DEFLATED, -15, 8, strategy)
    out: list[bytes] = []
    crc = 0
    for part in chunks:
        for i in range(0, len(part), _CHUNK):
            piece = part[i : i + _CHUNK]
            crc = crc32(piece, crc)
            out.append(comp.compress(piece))
    out.append(comp.flush())
    return crc, [c for c in out if c]


def _choose_strategy(sample: bytes, text: bool, auto: bool) -> int | None:
    """Pick a DEFLATE strategy from a sample, or ``None`` to store (``auto`` only)."""
    if text:
        return zlib.Z_DEFAULT_STRATEGY
    if not sample:
        return None if auto else zlib.Z_RLE
    # Z_RLE is several times faster than the default on float data and shrinks
    # it just as much; the default strategy wins on smooth integer data.
    rle = sum(len(c) for c in _deflate_all([sample], zlib.Z_RLE, 1)[1])
    if auto and rle > _AUTO_RATIO * len(sample):
        return None
    default = sum(len(c) for c in _deflate_all([sample], zlib.Z_DEFAULT_STRATEGY, 1)[1])
    return zlib.Z_DEFAULT_STRATEGY if default < 0.8 * rle else zlib.Z_RLE


def _first_sample(member: Member) -> bytes:
    if member.sample is not None:
        return member.sample
    if member.parts is not None:
        return _sample(member.parts)
    # The first chunk may be a short header: gather enough of the content.
    sample = bytearray()
    for chunk in member.chunks():
        sample += bytes(chunk[: 3 * _SAMPLE - len(sample)])
        if len(sample) >= 3 * _SAMPLE:
            break
    return bytes(sample)


def _crc_of(chunks: Iterable[Chunk]) -> int:
    crc = 0
    for chunk in chunks:
        crc = crc32(chunk, crc)
    return crc


def _prepare(member: Member, compression: str) -> _Prepared:
    strategy = None
    tiny = compression == "auto" and member.size < _TINY and not member.text
    if compression != "none" and member.size and not tiny:
        strategy = _choose_strategy(_first_sample(member), member.text, compression == "auto")
    if strategy is not None:
        level = 6 if member.text else 1
        crc, chunks = _deflate_all(member.chunks(), strategy, level)
        csize = sum(len(c) for c in chunks)
        if compression == "deflate" or csize < member.size:
            return _Prepared(crc, member.size, _DEFLATED, chunks, csize, _crc_of(chunks))
    else:
        crc = _crc_of(member.chunks())
    return _Prepared(crc, member.size, _STORED, None, member.size, crc)


def _local_header(name: bytes, prep: _Prepared, zip64: bool) -> bytes:
    extra = struct.pack("<HHQQ", 1, 16, prep.size, prep.csize) if zip64 else b""
    sizes = (_ZIP64_LIMIT, _ZIP64_LIMIT) if zip64 else (prep.csize, prep.size)
    return (
        struct.pack(
            "<IHHHHHIIIHH",
            0x04034B50,
            45 if zip64 else 20,
            0x800,  # names are UTF-8
            prep.method,
            0,
            _DOS_DATE,
            prep.crc,
            sizes[0],
            sizes[1],
            len(name),
            len(extra),
        )
        + name
        + extra
    )


def _central_entry(name: bytes, prep: _Prepared, offset: int, zip64: bool) -> bytes:
    fields: list[int] = []
    usize, csize, off = prep.size, prep.csize, offset
    if zip64 or usize >= _ZIP64_LIMIT:
        fields.append(usize)
        usize = _ZIP64_LIMIT
    if zip64 or csize >= _ZIP64_LIMIT:
        fields.append(csize)
        csize = _ZIP64_LIMIT
    if offset >= _ZIP64_LIMIT:
        fields.append(offset)
        off = _ZIP64_LIMIT
    extra = struct.pack(f"<HH{len(fields)}Q", 1, 8 * len(fields), *fields) if fields else b""
    needed = 45 if fields else 20
    return (
        struct.pack(
            "<IHHHHHHIIIHHHHHII",
            0x02014B50,
            (3 << 8) | 45,  # made by: Unix, spec 4.5
            needed,
            0x800,
            prep.method,
            0,
            _DOS_DATE,
            prep.crc,
            csize,
            usize,
            len(name),
            len(extra),
            0,
            0,
            0,
            0o100644 << 16,
            off,
        )
        + name
        + extra
    )


def _end_records(count: int, cd_offset: int, cd_size: int) -> bytes:
    out = b""
    big = count >= 0xFFFF or cd_offset >= _ZIP64_LIMIT or cd_size >= _ZIP64_LIMIT
    if big:
        zip64_end = cd_offset + cd_size
        out += struct.pack(
            "<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, cd_size, cd_offset
        )
        out += struct.pack("<IIQI", 0x07064B50, 0, zip64_end, 1)
    out += struct.pack(
        "<IHHHHIIH",
        0x06054B50,
        0,
        0,
        min(count, 0xFFFF),
        min(count, 0xFFFF),
        min(cd_size, _ZIP64_LIMIT),
        min(cd_offset, _ZIP64_LIMIT),
        0,
    )
    return out


def write_zip(
    stream: BinaryIO,
    members: Sequence[Member],
    *,
    compression: str,
    after_member: Callable[[str], None] | None = None,
) -> tuple[int, int]:
    """Write ``members`` as a zip archive to ``stream``, compressing in parallel.

    Offsets in the archive count from where ``stream`` is when called, so an
    archive can be written inside another one.

    Args:
        stream: a binary file opened for writing.
        members: the members, in archive order.
        compression: ``"auto"``, ``"deflate"`` or ``"none"``.
        after_member: called with each member name once it is written (test hook).

    Returns:
        ``(size, crc)``: the number of bytes written and their CRC-32.
    """
    if compression != "deflate" and _all_tiny(members):
        return _write_tiny(stream, members, after_member)
    central: list[bytes] = []
    offset = 0  # bytes handed to write(), buffered or not
    crc = 0
    # Small pieces (headers, tiny members) gather in one buffer that goes out in
    # big writes: one system call per piece costs more than the copy.
    buffer = bytearray()

    def flush() -> None:
        _write_fully(stream, buffer)
        buffer.clear()

    def write(data: Chunk) -> None:
        nonlocal offset
        n = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        if n >= _DIRECT_WRITE:
            if buffer:
                flush()
            _write_fully(stream, data)
        else:
            buffer.extend(data)
            if len(buffer) >= _BUFFER:
                flush()
        offset += n

    def write_small(data: bytes) -> None:
        nonlocal crc
        crc = crc32(data, crc)
        write(data)

    for member, prep in _prepared(members, compression):
        name = member.name.encode("utf-8")
        zip64 = prep.size >= _ZIP64_LIMIT or prep.csize >= _ZIP64_LIMIT
        start = offset
        write_small(_local_header(name, prep, zip64))
        payload = prep.payload if prep.payload is not None else member.chunks()
        if prep.csize <= _TINY:
            for chunk in payload:
                crc = crc32(chunk, crc)
                write(chunk)
        else:
            for chunk in payload:
                write(chunk)
            crc = crc32_combine(crc, prep.payload_crc, prep.csize)
        central.append(_central_entry(name, prep, start, zip64))
        if after_member is not None:
            after_member(member.name)
    cd_offset = offset
    for entry in central:
        write_small(entry)
    write_small(_end_records(len(central), cd_offset, offset - cd_offset))
    if buffer:
        flush()
    return offset, crc


_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")


def _all_tiny(members: Sequence[Member]) -> bool:
    """Whether every member is a small, in-memory, non-text one (stored, never deflated)."""
    total = 0
    for member in members:
        if member.parts is None or member.text or member.size >= _TINY:
            return False
        total += member.size
    return total < _BUFFER


def _write_tiny(
    stream: BinaryIO, members: Sequence[Member], after_member: Callable[[str], None] | None
) -> tuple[int, int]:
    """:func:`write_zip` for members that are all tiny: stored, built in memory, one write.

    The same bytes the general path writes for stored members, without its
    per-member machinery (a checkpoint of small arrays spends its export there).
    """
    pieces: list[bytes] = []
    central: list[bytes] = []
    offset = 0
    for member in members:
        name = member.name.encode("utf-8")
        data = b"".join(member.parts)  # pyright: ignore[reportCallIssue, reportArgumentType]
        crc, size = crc32(data), len(data)
        header = _LOCAL.pack(
            0x04034B50, 20, 0x800, _STORED, 0, _DOS_DATE, crc, size, size, len(name), 0
        )
        pieces += (header, name, data)
        central.append(
            _CENTRAL.pack(
                0x02014B50,
                (3 << 8) | 45,
                20,
                0x800,
                _STORED,
                0,
                _DOS_DATE,
                crc,
                size,
                size,
                len(name),
                0,
                0,
                0,
                0,
                0o100644 << 16,
                offset,
            )
            + name
        )
        offset += len(header) + len(name) + size
    directory = b"".join(central)
    pieces += (directory, _end_records(len(central), offset, len(directory)))
    blob = b"".join(pieces)
    _write_fully(stream, blob)
    if after_member is not None:
        for member in members:
            after_member(member.name)
    return len(blob), crc32(blob)


def _write_fully(stream: BinaryIO, data: Chunk | bytearray) -> None:
    view = memoryview(data)
    while view.nbytes:
        n = stream.write(view)
        if n is None:  # pragma: no cover - only non-blocking streams return None
            continue
        view = view[n:]


def _prepared(members: Sequence[Member], compression: str) -> Iterator[tuple[Member, _Prepared]]:
    """Yield each member with its CRC and payload, in order.

    Members of at least ``_INLINE`` bytes are prepared on the worker pool, a
    few ahead of the writer; smaller ones on the calling thread when reached
    (handing a tiny member to a thread costs more than its CRC).
    """
    heavy = [i for i, m in enumerate(members) if m.size >= _INLINE]
    total = sum(members[i].size for i in heavy)
    if len(heavy) <= 1 or WORKERS == 1 or total < _PARALLEL_BYTES:
        for m in members:
            yield m, _prepare(m, compression)
        return
    window = 2 * WORKERS
    workers = pool()
    futures: dict[int, concurrent.futures.Future[_Prepared]] = {}
    ahead = 0  # next position in ``heavy`` to submit
    try:
        for i, m in enumerate(members):
            while ahead < len(heavy) and len(futures) < window:
                futures[heavy[ahead]] = workers.submit(_prepare, members[heavy[ahead]], compression)
                ahead += 1
            future = futures.pop(i, None)
            yield m, (future.result() if future is not None else _prepare(m, compression))
    finally:
        for future in futures.values():
            future.cancel()


def stored_header(name: str) -> bytes:
    """A ZIP64 local header for a stored member whose size and CRC are patched in later."""
    prep = _Prepared(0, 0, _STORED, None, 0, 0)
    return _local_header(name.encode("utf-8"), prep, True)


def patch_stored_header(name: str, size: int, crc: int) -> bytes:
    """The final form of :func:`stored_header` (same length)."""
    prep = _Prepared(crc, size, _STORED, None, size, crc)
    return _local_header(name.encode("utf-8"), prep, True)


def write_outer(
    stream: BinaryIO,
    entries: Sequence[tuple[str, int, int, int, int, int, int]],
    start: int,
) -> None:
    """Write the central directory of an outer archive written by hand.

    ``entries``: ``(name, offset, method, crc, size, csize, zip64)`` per member;
    ``start``: the stream offset where the central directory begins.
    """
    central = b""
    for name, off, method, crc, size, csize, zip64 in entries:
        prep = _Prepared(crc, size, method, None, csize, crc)
        central += _central_entry(name.encode("utf-8"), prep, off, bool(zip64))
    tail = central + _end_records(len(entries), start, len(central))
    view = memoryview(tail)
    while view.nbytes:
        n = stream.write(view)
        view = view[n or 0 :]


def prepare_text(member: Member, compression: str) -> tuple[int, int, int, int, list[Chunk]]:
    """Prepare a small member: ``(method, crc, size, csize, payload)``."""
    prep = _prepare(member, compression)
    payload = list(prep.payload) if prep.payload is not None else list(member.chunks())
    return prep.method, prep.crc, prep.size, prep.csize, payload


def local_header(name: str, method: int, crc: int, size: int, csize: int) -> bytes:
    """A local header for a member whose sizes are known (no ZIP64)."""
    prep = _Prepared(crc, size, method, None, csize, crc)
    return _local_header(name.encode("utf-8"), prep, False)
