"""A zip writer that deflates members in parallel, and a zip reader for untrusted files.

The standard library's :mod:`zipfile` compresses one member at a time on one
core and cannot take data that is already compressed, so members are written
here: each member's CRC and (optional) DEFLATE stream are computed on a thread
pool (``zlib`` releases the GIL), and the main thread writes finished members
in order. The output is an ordinary zip (ZIP64 when needed) that
:mod:`zipfile` and ``numpy.load`` read.

Reading parses the central directory with :mod:`zipfile`, then checks every
entry (method, encryption, sizes, overlapping ranges) before reading member
data straight into caller-provided buffers.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import BinaryIO

from jaxstruct.registry import SerializationError

__all__ = ["Entry", "Member", "ZipIndex", "read_index", "write_zip"]

_STORED, _DEFLATED = 0, 8
_ZIP64_LIMIT = 0xFFFFFFFF
_DOS_DATE = (1 << 5) | 1  # 1980-01-01: fixed timestamps make exports reproducible.
_SAMPLE = 8 * 1024
_AUTO_RATIO = 0.85
_CHUNK = 4 << 20

WORKERS = max(1, min(8, os.cpu_count() or 1))


@dataclasses.dataclass
class Member:
    """One member to write: a name and the byte strings that make up its content."""

    name: str
    parts: Sequence[bytes | memoryview]
    text: bool = False  # JSON: compress with the default strategy.


@dataclasses.dataclass
class _Prepared:
    crc: int
    size: int
    method: int
    payload: Sequence[bytes | memoryview]
    csize: int


def _sample(parts: Sequence[bytes | memoryview]) -> bytes:
    whole = b"".join(bytes(p) for p in parts) if sum(len(p) for p in parts) <= 3 * _SAMPLE else None
    if whole is not None:
        return whole
    data = parts[-1]
    n = len(data)
    return b"".join(bytes(data[i : i + _SAMPLE]) for i in (0, (n - _SAMPLE) // 2, n - _SAMPLE))


def _deflate(parts: Sequence[bytes | memoryview], strategy: int, level: int) -> list[bytes]:
    comp = zlib.compressobj(level, zlib.DEFLATED, -15, 8, strategy)
    out: list[bytes] = []
    for part in parts:
        for i in range(0, len(part), _CHUNK):
            out.append(comp.compress(part[i : i + _CHUNK]))
    out.append(comp.flush())
    return out


def _choose_strategy(parts: Sequence[bytes | memoryview], text: bool, auto: bool) -> int | None:
    """Pick a DEFLATE strategy from a sample, or ``None`` to store (``auto`` only)."""
    if text:
        return zlib.Z_DEFAULT_STRATEGY
    sample = _sample(parts)
    if not sample:
        return None if auto else zlib.Z_RLE
    # Z_RLE is several times faster than the default on float data and shrinks
    # it just as much; the default strategy wins on smooth integer data.
    rle = len(_join(_deflate([sample], zlib.Z_RLE, 1)))
    if auto and rle > _AUTO_RATIO * len(sample):
        return None
    default = len(_join(_deflate([sample], zlib.Z_DEFAULT_STRATEGY, 1)))
    return zlib.Z_DEFAULT_STRATEGY if default < 0.8 * rle else zlib.Z_RLE


def _join(chunks: Iterable[bytes]) -> bytes:
    return b"".join(chunks)


def _prepare(member: Member, compression: str) -> _Prepared:
    crc = 0
    size = 0
    for part in member.parts:
        crc = zlib.crc32(part, crc)
        size += len(part)
    strategy = (
        None
        if compression == "none"
        else _choose_strategy(member.parts, member.text, compression == "auto")
    )
    if strategy is not None:
        level = 6 if member.text else 1
        chunks = _deflate(member.parts, strategy, level)
        csize = sum(len(c) for c in chunks)
        if compression == "deflate" or csize < size:
            return _Prepared(crc, size, _DEFLATED, chunks, csize)
    return _Prepared(crc, size, _STORED, member.parts, size)


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
) -> None:
    """Write ``members`` as a zip archive to ``stream`` (positioned at 0), compressing in parallel.

    Args:
        stream: a binary file opened for writing.
        members: the members, in archive order.
        compression: ``"auto"``, ``"deflate"`` or ``"none"``.
        after_member: called with each member name once it is written (test hook).
    """
    central: list[bytes] = []
    offset = 0

    def write(data: bytes | memoryview) -> None:
        nonlocal offset
        view = memoryview(data)
        while view.nbytes:
            n = stream.write(view)
            if n is None:  # pragma: no cover - only non-blocking streams return None
                continue
            offset += n
            view = view[n:]

    def results() -> Iterator[tuple[Member, _Prepared]]:
        if len(members) <= 1 or WORKERS == 1:
            for m in members:
                yield m, _prepare(m, compression)
            return
        window = 2 * WORKERS
        with concurrent.futures.ThreadPoolExecutor(
            WORKERS, thread_name_prefix="jaxstruct-zip"
        ) as pool:
            futures: list[concurrent.futures.Future[_Prepared]] = []
            nxt = 0
            for i, m in enumerate(members):
                while nxt < len(members) and nxt < i + window:
                    futures.append(pool.submit(_prepare, members[nxt], compression))
                    nxt += 1
                yield m, futures[i].result()
                futures[i] = None  # type: ignore[call-overload]  # drop the finished payload

    for member, prep in results():
        name = member.name.encode("utf-8")
        zip64 = prep.size >= _ZIP64_LIMIT or prep.csize >= _ZIP64_LIMIT
        start = offset
        write(_local_header(name, prep, zip64))
        for chunk in prep.payload:
            write(chunk)
        central.append(_central_entry(name, prep, start, zip64))
        if after_member is not None:
            after_member(member.name)
    cd_offset = offset
    for entry in central:
        write(entry)
    write(_end_records(len(central), cd_offset, offset - cd_offset))


@dataclasses.dataclass(frozen=True)
class Entry:
    """A checked zip member: where its data starts and how it is stored."""

    name: str
    data_offset: int
    csize: int
    size: int
    method: int
    crc: int


@dataclasses.dataclass(frozen=True)
class ZipIndex:
    """The checked members of an archive, by name."""

    entries: dict[str, Entry]


def read_index(fd: int, file_size: int, where: str, *, max_ratio: int) -> ZipIndex:
    """Parse and check the central directory of the zip archive open at ``fd``.

    Raises:
        SerializationError: the archive is malformed, encrypted, uses another
            compression method, names a member twice, has members that overlap
            or run past the end of the file, or claims an inflation ratio above
            ``max_ratio``.
    """
    try:
        with os.fdopen(os.dup(fd), "rb") as handle, zipfile.ZipFile(handle) as archive:
            infos = archive.infolist()
    except Exception as err:  # zipfile raises many types on hostile input
        raise SerializationError(
            f"{where}: not a readable zip archive ({type(err).__name__}: {err})"
        ) from None
    entries: dict[str, Entry] = {}
    spans: list[tuple[int, int, str]] = []
    for info in infos:
        name = info.filename
        if name in entries:
            raise SerializationError(f"{where}: archive holds member {name!r} twice")
        if info.flag_bits & 0x1:
            raise SerializationError(f"{where}: member {name!r} is encrypted")
        if info.compress_type not in (_STORED, _DEFLATED):
            raise SerializationError(
                f"{where}: member {name!r} uses compression method {info.compress_type}; "
                "only stored (0) and deflate (8) are read"
            )
        if info.compress_type == _STORED and info.compress_size != info.file_size:
            raise SerializationError(f"{where}: stored member {name!r} has inconsistent sizes")
        if info.compress_type == _DEFLATED and info.file_size > max_ratio * max(
            info.compress_size, 1
        ):
            raise SerializationError(
                f"{where}: member {name!r} would inflate {info.compress_size} bytes to "
                f"{info.file_size} (ratio above max_inflation_ratio={max_ratio}); if you trust "
                "this file, load it with a larger max_inflation_ratio="
            )
        if not 0 <= info.header_offset <= file_size - 30 or info.compress_size < 0:
            raise SerializationError(f"{where}: member {name!r} has an invalid offset or size")
        header = os.pread(fd, 30, info.header_offset)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise SerializationError(f"{where}: member {name!r} has no valid local header")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        local_name = os.pread(fd, name_len, info.header_offset + 30)
        if (
            local_name.decode("utf-8", "replace") != name
            and local_name.decode("cp437", "replace") != name
        ):
            raise SerializationError(f"{where}: member {name!r} has a mismatched local header")
        data_offset = info.header_offset + 30 + name_len + extra_len
        end = data_offset + info.compress_size
        if end > file_size:
            raise SerializationError(f"{where}: member {name!r} runs past the end of the file")
        spans.append((info.header_offset, end, name))
        entries[name] = Entry(
            name, data_offset, info.compress_size, info.file_size, info.compress_type, info.CRC
        )
    spans.sort()
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:
            raise SerializationError(f"{where}: members {a!r} and {b!r} overlap")
    return ZipIndex(entries)


class MemberReader:
    """Sequential reader of one checked member's decoded bytes, verifying its CRC at the end."""

    def __init__(self, fd: int, entry: Entry, where: str) -> None:
        self._fd = fd
        self._entry = entry
        self._where = where
        self._pos = entry.data_offset  # next compressed byte to read
        self._end = entry.data_offset + entry.csize
        self._produced = 0
        self._crc = 0
        self._pending = b""
        self._inflater = zlib.decompressobj(-15) if entry.method == _DEFLATED else None

    def _fail(self, problem: str) -> SerializationError:
        return SerializationError(f"{self._where}: member {self._entry.name!r}: {problem}")

    def read(self, n: int) -> bytes:
        """Return exactly ``n`` decoded bytes."""
        buf = bytearray(n)
        self.readinto(memoryview(buf))
        return bytes(buf)

    def readinto(self, view: memoryview) -> None:
        """Fill ``view`` (a byte view) with the next decoded bytes."""
        n = view.nbytes
        if self._produced + n > self._entry.size:
            raise self._fail("holds fewer bytes than its contents need")
        if self._inflater is None:
            done = 0
            while done < n:
                got = os.preadv(self._fd, [view[done:]], self._pos)
                if got <= 0:
                    raise self._fail("file ended early")
                done += got
                self._pos += got
            self._crc = zlib.crc32(view, self._crc)
        else:
            done = 0
            while done < n:
                if not self._pending:
                    self._pending = self._inflate(n - done)
                take = min(len(self._pending), n - done)
                view[done : done + take] = self._pending[:take]
                self._crc = zlib.crc32(self._pending[:take], self._crc)
                self._pending = self._pending[take:]
                done += take
        self._produced += n

    def _inflate(self, want: int) -> bytes:
        assert self._inflater is not None
        limit = min(max(want, 1 << 16), _CHUNK)
        while True:
            if self._inflater.unconsumed_tail:
                source = self._inflater.unconsumed_tail
            else:
                if self._pos >= self._end:
                    raise self._fail("compressed data ended early")
                source = os.pread(self._fd, min(_CHUNK, self._end - self._pos), self._pos)
                if not source:
                    raise self._fail("file ended early")
                self._pos += len(source)
            try:
                out = self._inflater.decompress(source, limit)
            except zlib.error as err:
                raise self._fail(f"corrupt compressed data ({err})") from None
            if out:
                return out
            if self._inflater.eof:
                raise self._fail("compressed data ended early")

    def finish(self) -> None:
        """Check that every byte was consumed and that the CRC matches."""
        if self._produced != self._entry.size:
            raise self._fail("holds more bytes than its contents need")
        if self._inflater is not None and (self._pending or self._inflater.unconsumed_tail):
            raise self._fail("holds more bytes than its contents need")
        if self._crc != self._entry.crc:
            raise self._fail("CRC mismatch: the data is corrupt")
