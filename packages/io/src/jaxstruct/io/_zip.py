"""Zip archives: a parallel writer (ZIP64, stored or deflated members) and a checked reader."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import itertools
import os
import struct
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, NamedTuple

from jaxstruct.registry import SerializationError
from zlib_ng import zlib_ng
from zlib_ng.zlib_ng import crc32, crc32_combine

from . import _pieces
from ._process import WORKERS, CrcParts, crc_pool, pool, submit

MANIFEST, ARRAYS = "manifest.json", "arrays.npz"  # the built-in formats' two files

_STORED, _DEFLATED = 0, 8
_ZIP64_LIMIT = 0xFFFFFFFF
_DOS_DATE = (1 << 5) | 1  # 1980-01-01: fixed timestamps make exports reproducible.
_SAMPLE = 8 * 1024
# compression="auto" deflates a member only when its sample shrinks to at most this
# fraction. A stored member loads at the speed of the disk or the page cache (GB/s);
# inflating runs at a few hundred MB/s per core, so only a large saving pays for it:
# masks, zeros and integer tables shrink to a few percent, while float weights
# (bf16 to about 0.78 with the fastest settings, float32 to 0.95) are stored.
_AUTO_RATIO = 0.5
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

    ``chunks()`` may be called more than once (a sample of the first bytes, the
    CRC or the compression, then the writing of a stored member), and must give
    the same bytes each time. Unless ``stable``, a buffer it yields may be reused
    by it once the next one is asked for, so it is copied (or used up) before that;
    with ``stable``, every buffer stays valid while referenced (fresh arrays).

    A ``once`` member (its chunks copied from a device) has ``chunks()`` called
    once only: ``sample()`` gives the bytes the compression choice looks at; stored,
    it is written as it comes, its CRC computed meanwhile and patched into its
    local header; deflated, its pieces are compressed from that one pass.
    """

    name: str
    size: int
    chunks: Callable[[], Iterable[Chunk]]
    text: bool = False  # JSON: compress with the default strategy.
    parts: Sequence[Chunk] | None = None  # the content, when it is already in memory
    stable: bool = False  # the buffers chunks() yields are never reused
    once: bool = False  # chunks() is costly (copied from a device): called once only
    sample: Callable[[], bytes] | None = None  # a few KiB of the content, made cheaply

    @classmethod
    def of(cls, name: str, parts: Sequence[Chunk], *, text: bool = False) -> Member:
        """A member made of ``parts`` already in memory."""
        return cls(
            name, sum(len(p) for p in parts), lambda: parts, text=text, parts=parts, stable=True
        )


@dataclasses.dataclass
class _Prepared:
    crc: int  # of the member's content
    size: int
    method: int
    payload: Sequence[Chunk] | None  # None: stream the content again (stored members)
    csize: int
    payload_crc: int  # of the bytes written to the archive (= crc when stored)
    table: bytes = b""  # the central directory's extra block of a pieced member
    crc_later: bool = False  # a ``once`` member: CRC computed while writing, then patched


def _sample(parts: Sequence[Chunk]) -> bytes:
    total = sum(len(p) for p in parts)
    if total <= 3 * _SAMPLE:
        return b"".join(bytes(p) for p in parts)
    data = parts[-1]
    n = len(data)
    if n < 3 * _SAMPLE:
        return bytes(data[:_SAMPLE])
    return b"".join(bytes(data[i : i + _SAMPLE]) for i in (0, (n - _SAMPLE) // 2, n - _SAMPLE))


def _deflated_size(sample: bytes, strategy: int) -> int:
    comp = zlib_ng.compressobj(1, zlib_ng.DEFLATED, -15, 8, strategy)
    return len(comp.compress(sample)) + len(comp.flush())


def _choose_strategy(sample: bytes, text: bool, auto: bool) -> int | None:
    """Pick a DEFLATE strategy from a sample, or ``None`` to store (``auto`` only)."""
    if text:
        return zlib_ng.Z_DEFAULT_STRATEGY
    if not sample:
        return None if auto else zlib_ng.Z_RLE
    # Z_RLE is several times faster than the default on float data and shrinks
    # it just as much; the default strategy wins on smooth integer data.
    rle = _deflated_size(sample, zlib_ng.Z_RLE)
    if auto and rle > _AUTO_RATIO * len(sample):
        return None
    default = _deflated_size(sample, zlib_ng.Z_DEFAULT_STRATEGY)
    return zlib_ng.Z_DEFAULT_STRATEGY if default < 0.8 * rle else zlib_ng.Z_RLE


def _first_sample(member: Member) -> bytes:
    if member.parts is not None:
        return _sample(member.parts)
    if member.sample is not None:
        return member.sample()[: 3 * _SAMPLE]
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


def _split(member: Member, piece: int) -> Iterator[tuple[list[Chunk], int]]:
    """The member's content cut into pieces of ``piece`` bytes: (segments, length) each.

    A first chunk shorter than a piece (a ``.npy`` header) is a piece of its own,
    so that the array's bytes start a piece: a load inflates every piece of the
    array straight into its buffer. Segments are views of the member's own buffers
    when they stay valid (in-memory parts, stable chunks), else copies made before
    the next chunk is asked for.
    """
    if member.size == 0:
        yield [], 0
        return
    source: Iterator[Chunk] = iter(member.parts if member.parts is not None else member.chunks())
    head = next(source, b"")
    if 0 < len(head) < piece < member.size:
        yield [head if member.stable else bytes(head)], len(head)
    else:
        source = itertools.chain([head], source)
    if member.stable:
        segments: list[Chunk] = []
        have = 0
        for chunk in source:
            view = memoryview(chunk).cast("B")
            while view.nbytes:
                take = min(view.nbytes, piece - have)
                segments.append(view[:take])
                view = view[take:]
                have += take
                if have == piece:
                    yield segments, have
                    segments, have = [], 0
        if have:
            yield segments, have
        return
    buffer = memoryview(bytearray(piece))
    have = 0
    for chunk in source:
        view = memoryview(chunk).cast("B")
        while view.nbytes:
            take = min(view.nbytes, piece - have)
            buffer[have : have + take] = view[:take]
            view = view[take:]
            have += take
            if have == piece:
                yield [buffer], have
                buffer, have = memoryview(bytearray(piece)), 0
    if have:
        yield [buffer[:have]], have


Run = Callable[..., "concurrent.futures.Future[Any]"]


def _now(fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
    """Run ``fn(*args)`` on this thread, as a finished future."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    done.set_result(fn(*args))
    return done


def _pooled(fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
    return submit(pool, fn, *args)


class _Job:
    """A member being prepared: its futures, and how to make its :class:`_Prepared`."""

    def __init__(
        self,
        futures: list[concurrent.futures.Future[Any]],
        finish: Callable[[list[Any]], _Prepared],
    ) -> None:
        self.futures, self._finish = futures, finish

    def result(self) -> _Prepared:
        return self._finish([f.result() for f in self.futures])

    def cancel(self) -> None:
        for future in self.futures:
            future.cancel()


def _start(member: Member, compression: str, run: Run) -> _Job:
    """Start preparing ``member``: its CRC, and its pieces deflated unless it is stored."""
    strategy = None
    tiny = compression == "auto" and member.size < _TINY and not member.text
    if compression != "none" and member.size and not tiny:
        strategy = _choose_strategy(_first_sample(member), member.text, compression == "auto")
    size = member.size
    piece = _pieces.piece_size(size)
    if strategy is None and member.once:  # its CRC is computed while it is written
        return _Job([], lambda _: _Prepared(0, size, _STORED, None, size, 0, crc_later=True))
    if strategy is None:
        if member.parts is None and not member.stable:
            futures = [run(_crc_of, member.chunks())]
            lengths = [size]
        else:
            pieces = list(_split(member, piece))
            futures = [run(_crc_of, segments) for segments, _ in pieces]
            lengths = [n for _, n in pieces]

        def stored(crcs: list[int]) -> _Prepared:
            crc = 0
            for c, n in zip(crcs, lengths, strict=True):
                crc = crc32_combine(crc, c, n)
            return _Prepared(crc, size, _STORED, None, size, crc)

        return _Job(futures, stored)
    level = 6 if member.text else 1
    futures, lengths = [], []
    done = 0
    for segments, n in _split(member, piece):
        done += n
        lengths.append(n)
        futures.append(run(_pieces.deflate_piece, segments, strategy, level, done >= size))
        if member.once:  # its pieces, copied from a device, wait in host memory: bound them
            _wait_behind(futures, 2 * WORKERS)
    if done != size:
        raise SerializationError(
            f"member {member.name!r}: its content gave {done} bytes, not the {size} announced"
        )

    def deflated(results: list[tuple[int, bytes, int]]) -> _Prepared:
        crc = payload_crc = csize = 0
        for (c, data, dc), n in zip(results, lengths, strict=True):
            crc = crc32_combine(crc, c, n)
            payload_crc = crc32_combine(payload_crc, dc, len(data))
            csize += len(data)
        # Stored instead when deflating saved nothing, unless the content is gone
        # (a ``once`` member: stored, it would be copied from its device again).
        if compression != "deflate" and csize >= size and not member.once:
            return _Prepared(crc, size, _STORED, None, size, crc)
        table = b""
        if len(results) > 1:
            table = _pieces.encode_table(
                piece, lengths[0], [len(r[1]) for r in results], [r[0] for r in results]
            )
        payload = [r[1] for r in results]
        return _Prepared(crc, size, _DEFLATED, payload, csize, payload_crc, table)

    return _Job(futures, deflated)


def _wait_behind(futures: Sequence[concurrent.futures.Future[Any]], ahead: int) -> None:
    """Wait until at most ``ahead`` of ``futures`` are unfinished (their inputs held)."""
    for future in futures[: max(0, len(futures) - ahead)]:
        future.result()


def _prepare(member: Member, compression: str) -> _Prepared:
    return _start(member, compression, _now).result()


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
    extra += prep.table
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
    """Write ``members`` as a zip archive to ``stream``, compressing in parallel."""
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

    base = stream.tell() if any(m.once for m in members) else 0
    for member, prep in _prepared(members, compression):
        name = member.name.encode("utf-8")
        zip64 = prep.size >= _ZIP64_LIMIT or prep.csize >= _ZIP64_LIMIT
        start = offset
        if prep.crc_later:
            before = crc
            write(_local_header(name, prep, zip64))
            prep.crc = prep.payload_crc = _write_counted(write, member.chunks())
            header = _local_header(name, prep, zip64)
            if offset - len(buffer) <= start:  # the header is still in the buffer
                at = start - (offset - len(buffer))
                buffer[at : at + len(header)] = header
            else:
                flush()
                _write_at(stream, base + start, header)
            crc = crc32_combine(crc32(header, before), prep.crc, prep.size)
            central.append(_central_entry(name, prep, start, zip64))
            if after_member is not None:
                after_member(member.name)
            continue
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


def _write_counted(write: Callable[[Chunk], None], chunks: Iterable[Chunk]) -> int:
    """Write ``chunks`` and return their CRC, each big chunk's computed on a CRC thread
    while it is written (both release the GIL)."""
    crc = 0
    for chunk in chunks:
        n = len(chunk) if isinstance(chunk, bytes) else memoryview(chunk).nbytes
        if n < _OVERLAP_CRC:
            crc = crc32(chunk, crc)
            write(chunk)
            continue
        part = submit(crc_pool, crc32, chunk)
        try:
            write(chunk)
        finally:
            value = part.result()
        crc = crc32_combine(crc, value, n)
    return crc


def _write_at(stream: BinaryIO, position: int, data: bytes) -> None:
    """Write ``data`` at ``position`` of ``stream``, then return to where it was."""
    end = stream.tell()
    stream.seek(position)
    _write_fully(stream, data)
    stream.seek(end)


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
    """:func:`write_zip` for members that are all tiny: stored, built in memory, one write."""
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

    Members of at least ``_INLINE`` bytes are cut into pieces that the pool
    compresses (or checksums) while earlier members are written; up to
    ``2 * WORKERS`` of them are started ahead of the one being written.
    """
    heavy = [i for i, m in enumerate(members) if m.size >= _INLINE]
    total = sum(members[i].size for i in heavy)
    if not heavy or WORKERS == 1 or total < _PARALLEL_BYTES:
        for m in members:
            yield m, _prepare(m, compression)
        return
    window = 2 * WORKERS
    jobs: dict[int, _Job] = {}
    ahead = 0  # next position in ``heavy`` to start
    try:
        for i, m in enumerate(members):
            while ahead < len(heavy) and len(jobs) < window:
                jobs[heavy[ahead]] = _start(members[heavy[ahead]], compression, _pooled)
                ahead += 1
            job = jobs.pop(i, None)
            yield m, (job.result() if job is not None else _prepare(m, compression))
    finally:
        for job in jobs.values():
            job.cancel()


def write_outer(
    stream: BinaryIO,
    manifest: bytes,
    members: Sequence[Member],
    *,
    compression: str,
    after_member: Callable[[str], None] | None = None,
) -> None:
    """Write the zip checkpoint to ``stream``: ``manifest.json`` (deflated unless
    ``compression="none"``), then ``arrays.npz``, the zip of ``members``, stored."""
    text = Member.of(MANIFEST, [manifest], text=True)
    prep = _prepare(text, "none" if compression == "none" else "deflate")
    name, arrays_name = MANIFEST.encode("utf-8"), ARRAYS.encode("utf-8")
    _write_fully(stream, _local_header(name, prep, False))
    for chunk in prep.payload if prep.payload is not None else text.chunks():
        _write_fully(stream, chunk)
    arrays_at = stream.tell()
    # The size and CRC of arrays.npz are patched in once it is written; its local
    # header reserves the ZIP64 fields, the size being unknown until then.
    _write_fully(stream, _local_header(arrays_name, _Prepared(0, 0, _STORED, None, 0, 0), True))
    size, crc = write_zip(stream, members, compression=compression, after_member=after_member)
    inner = _Prepared(crc, size, _STORED, None, size, crc)
    os.pwrite(stream.fileno(), _local_header(arrays_name, inner, True), arrays_at)
    start = stream.tell()
    # ZIP64 fields in the central directory only where a size or offset needs them.
    central = _central_entry(name, prep, 0, False) + _central_entry(
        arrays_name, inner, arrays_at, False
    )
    _write_fully(stream, central + _end_records(2, start, len(central)))


# Bytes of member name read together with each local header.
_NAME_GUESS = 226
# A stored member of at most this many bytes is read whole, with one system call.
_READ_WHOLE = 64 << 10
# An archive of at most this many bytes is read whole, with one system call.
_WHOLE_FILE = 64 << 10
# A stored member of at least this many bytes has the CRCs of its pieces computed
# on two threads of their own while the next pieces are read (zlib releases the
# GIL), then combined in order: checking no longer adds its time to the reading.
_OVERLAP_CRC = 2 << 20


class Entry(NamedTuple):
    """A checked zip member: where its data starts and how it is stored."""

    name: str
    data_offset: int
    csize: int
    size: int
    method: int
    crc: int
    pieces: bytes = b""  # the piece table of a member deflated in pieces (see _pieces)


@dataclasses.dataclass(frozen=True)
class ZipIndex:
    """The checked members of an archive, by name."""

    entries: dict[str, Entry]
    data: bytes | memoryview | None = None
    base: int = 0

    def cached(self, offset: int, size: int) -> memoryview | None:
        """The ``size`` bytes at file ``offset`` if ``data`` holds them, else ``None``."""
        if self.data is None:
            return None
        start = offset - self.base
        if start < 0 or start + size > len(self.data):
            return None
        return memoryview(self.data)[start : start + size]


# (name, flag bits, method, compressed size, size, local header offset, CRC, piece
# table) per member.
_Record = tuple[str, int, int, int, int, int, int, bytes]
_EOCD = struct.Struct("<IHHHHIIH")
_SIMPLE_MAX = 0xFFFF  # a count or size with all bits set defers to ZIP64 records
_ZIP_VERSION = 63  # the newest "version needed to extract" zipfile reads


def _simple_records(read: Any, file_size: int) -> list[_Record] | None:
    """The members of an archive laid out as export writes small ones, else ``None``."""
    if file_size < _EOCD.size:
        return None
    end = file_size - _EOCD.size
    sig, disk, cd_disk, here, count, cd_size, cd_offset, comment = _EOCD.unpack(
        read(end, _EOCD.size)
    )
    if (
        sig != 0x06054B50
        or disk
        or cd_disk
        or comment
        or here != count
        or count == _SIMPLE_MAX
        or cd_offset + cd_size != end
        or (end >= 20 and read(end - 20, 4) == b"PK\x06\x07")  # a ZIP64 locator
    ):
        return None
    central = read(cd_offset, cd_size)
    records: list[_Record] = []
    pos = 0
    while pos < cd_size:
        if pos + _CENTRAL.size > cd_size:
            return None
        (sig, _, needed, flags, method, _, _, crc, csize, size, name_len, extra_len,
         comment_len, _, _, _, offset) = _CENTRAL.unpack_from(central, pos)  # fmt: skip
        if (
            sig != 0x02014B50
            or (needed & 0xFF) > _ZIP_VERSION
            or 0xFFFFFFFF in (csize, size, offset)
        ):
            return None
        pos += _CENTRAL.size
        raw = bytes(central[pos : pos + name_len])
        table = b""
        if extra_len:  # only a piece table is read here; ZIP64 and the rest go to zipfile
            found = _pieces.find_block(central[pos + name_len : pos + name_len + extra_len])
            if found is None or found[1] or pos + name_len + extra_len > cd_size:
                return None
            table = found[0]
        pos += name_len + extra_len + comment_len
        try:
            name = raw.decode("utf-8" if flags & 0x800 else "cp437")
        except UnicodeDecodeError:
            return None
        if "\0" in name or "\\" in name or pos > cd_size:
            return None
        records.append((name, flags, method, csize, size, offset, crc, table))
    return records if len(records) == count else None


def _zipfile_records(fd: int, file_size: int, base: int, where: str) -> list[_Record]:
    """The members of any archive :mod:`zipfile` can read."""
    try:
        window = io.BufferedReader(_Window(fd, base, file_size))
        with zipfile.ZipFile(window) as archive:
            infos = archive.infolist()
    except Exception as err:  # zipfile raises many types on hostile input
        raise SerializationError(
            f"{where}: not a readable zip archive ({type(err).__name__}: {err})"
        ) from None
    records: list[_Record] = []
    for info in infos:
        found = _pieces.find_block(info.extra)
        records.append(
            (
                info.filename,
                info.flag_bits,
                info.compress_type,
                info.compress_size,
                info.file_size,
                info.header_offset,
                info.CRC,
                found[0] if found is not None else b"",
            )
        )
    return records


class _Window(io.RawIOBase):
    """A read-only file over ``size`` bytes of ``fd`` starting at ``base`` (for :mod:`zipfile`)."""

    def __init__(self, fd: int, base: int, size: int) -> None:
        self._fd, self._base, self._size, self._pos = fd, base, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = {0: 0, 1: self._pos, 2: self._size}[whence] + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        want = max(0, min(len(buffer), self._size - self._pos))
        data = os.pread(self._fd, want, self._base + self._pos) if want else b""
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def read_index(
    fd: int,
    file_size: int,
    where: str,
    *,
    max_ratio: int,
    base: int = 0,
    data: bytes | memoryview | None = None,
) -> ZipIndex:
    """Parse and check the central directory of the zip archive open at ``fd``."""
    if data is None and file_size <= _WHOLE_FILE:
        data = os.pread(fd, file_size, base)
        if len(data) != file_size:
            raise SerializationError(f"{where}: the file ended early (was it changed meanwhile?)")
    if data is not None:
        whole = data
        read = lambda offset, n: whole[offset : offset + n]
    else:
        read = lambda offset, n: os.pread(fd, n, base + offset)
    records = _simple_records(read, file_size)
    if records is None:
        records = _zipfile_records(fd, file_size, base, where)
    entries: dict[str, Entry] = {}
    spans: list[tuple[int, int, str]] = []
    for name, flags, method, csize, size, header_offset, crc, table in records:
        if name in entries:
            raise SerializationError(f"{where}: archive holds member {name!r} twice")
        if flags & 0x1:
            raise SerializationError(f"{where}: member {name!r} is encrypted")
        if method not in (_STORED, _DEFLATED):
            raise SerializationError(
                f"{where}: member {name!r} uses compression method {method}; "
                "only stored (0) and deflate (8) are read"
            )
        if method == _STORED and csize != size:
            raise SerializationError(f"{where}: stored member {name!r} has inconsistent sizes")
        if method == _DEFLATED and size > max_ratio * max(csize, 1):
            raise SerializationError(
                f"{where}: member {name!r} would inflate {csize} bytes to {size} (ratio above "
                f"max_inflation_ratio={max_ratio}); if you trust this file, load it with a "
                "larger max_inflation_ratio="
            )
        if not 0 <= header_offset <= file_size - 30 or csize < 0:
            raise SerializationError(f"{where}: member {name!r} has an invalid offset or size")
        # The local header and (usually) its name in one read.
        header = read(header_offset, 30 + _NAME_GUESS)
        if len(header) < 30 or header[:4] != b"PK\x03\x04":
            raise SerializationError(f"{where}: member {name!r} has no valid local header")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        if name_len <= _NAME_GUESS:
            local_name = bytes(header[30 : 30 + name_len])
        else:
            local_name = bytes(read(header_offset + 30, name_len))
        if (
            local_name.decode("utf-8", "replace") != name
            and local_name.decode("cp437", "replace") != name
        ):
            raise SerializationError(f"{where}: member {name!r} has a mismatched local header")
        data_offset = header_offset + 30 + name_len + extra_len
        end = data_offset + csize
        if end > file_size:
            raise SerializationError(f"{where}: member {name!r} runs past the end of the file")
        spans.append((header_offset, end, name))
        if table and method != _DEFLATED:
            raise SerializationError(f"{where}: member {name!r} is stored but has a piece table")
        entries[name] = Entry(name, base + data_offset, csize, size, method, crc, table)
    spans.sort()
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:
            raise SerializationError(f"{where}: members {a!r} and {b!r} overlap")
    return ZipIndex(entries, data, base)


class MemberReader:
    """Sequential reader of one checked member's decoded bytes, verifying its CRC at the end."""

    def __init__(self, fd: int, entry: Entry, where: str, index: ZipIndex | None = None) -> None:
        self._fd = fd
        self._entry = entry
        self._where = where
        self._pos = entry.data_offset  # next compressed byte to read
        self._end = entry.data_offset + entry.csize
        self._produced = 0
        self._crc = 0
        self._pending: bytes | memoryview = b""
        self._inflater = zlib_ng.decompressobj(-15) if entry.method == _DEFLATED else None
        # A member deflated in pieces: they are inflated on every core, each checked
        # against its own CRC (the table's CRCs combine into the member's).
        self._table: _pieces.Table | None = None
        self._piece = 0  # the next piece not yet inflated
        if self._inflater is not None and entry.pieces:
            self._table = _pieces.parse_table(
                entry.pieces, entry.size, entry.csize, entry.crc, self._fail
            )
        # The member's bytes as stored, when the index holds the whole archive.
        cached = index.cached(entry.data_offset, entry.csize) if index is not None else None
        # A small stored member (a .npy header and a tiny array) is read with one
        # system call up front (or taken from the index), not one per piece asked for.
        self._whole: bytes | memoryview | None = None
        if self._inflater is None and entry.csize <= _READ_WHOLE:
            self._whole = cached if cached is not None else os.pread(fd, entry.csize, self._pos)
        # A deflated member held in memory is inflated from there.
        self._compressed = cached if self._inflater is not None else None
        self._chain: CrcParts | None = None

    def _fail(self, problem: str) -> SerializationError:
        return SerializationError(f"{self._where}: member {self._entry.name!r}: {problem}")

    def check_in_background(self) -> bool:
        """Compute the CRC of a big stored member on the CRC threads, overlapping the reads."""
        if self._inflater is None and self._whole is None and self._entry.csize >= _OVERLAP_CRC:
            self._chain = CrcParts(self._crc)
        return self._chain is not None

    def read(self, n: int) -> bytes:
        """Return exactly ``n`` decoded bytes."""
        buf = bytearray(n)
        self.readinto(memoryview(buf))
        return bytes(buf)

    @property
    def pieced(self) -> bool:
        """Whether the member is deflated in pieces (big reads inflate them in parallel)."""
        return self._table is not None

    def skip(self, n: int) -> None:
        """Pass over the next ``n`` decoded bytes; pieces wholly inside them are not read.

        Pieces that are read are checked; a member read in full is checked whole.
        """
        if self._produced + n > self._entry.size:
            raise self._fail("holds fewer bytes than its contents need")
        table = self._table
        if table is None:
            scratch = memoryview(bytearray(min(n, 1 << 20) or 1))
            done = 0
            while done < n:
                take = min(scratch.nbytes, n - done)
                self.readinto(scratch[:take])
                done += take
            return
        take = min(len(self._pending), n)
        self._pending = self._pending[take:]
        left = n - take
        while left and left >= table.length(self._piece):
            left -= table.length(self._piece)
            self._piece += 1
        if left:
            self._pending = self._inflate_piece()[left:]
        self._produced += n

    def _read_compressed(self, offset: int, n: int) -> bytes | memoryview:
        """``n`` bytes of the member's compressed data at ``offset`` in it."""
        if self._compressed is not None:
            return self._compressed[offset : offset + n]
        # Into this thread's scratch buffer, reused piece after piece (each piece is
        # inflated before the thread reads the next): no fresh memory per piece.
        view = _pieces.scratch(n)
        if os.preadv(self._fd, [view], self._entry.data_offset + offset) != n:
            raise self._fail("file ended early")
        return view

    def _inflate_piece(self) -> bytes:
        table = self._table
        assert table is not None
        i = self._piece
        if i >= table.count:
            raise self._fail("holds fewer bytes than its contents need")
        start, end = table.starts[i], table.starts[i + 1]
        self._piece += 1
        return _pieces.inflate_piece(
            self._read_compressed(start, end - start), table, i, self._fail
        )

    def _readinto_pieces(self, view: memoryview, later: list[Callable[[], None]] | None) -> None:
        table = self._table
        assert table is not None
        n = view.nbytes
        done = min(len(self._pending), n)
        if done:
            view[:done] = self._pending[:done]
            self._pending = self._pending[done:]
        # Whole pieces go straight into the view, inflated on every core.
        whole = done
        last = self._piece
        while last < table.count and whole + table.length(last) <= n:
            whole += table.length(last)
            last += 1
        wait = later is None or whole < n
        if last == self._piece + 1 and wait:  # one piece (a .npy header): on this thread
            view[done:whole] = self._inflate_piece()
        elif last > self._piece:
            waiter = _pieces.inflate_into(
                self._read_compressed,
                table,
                self._piece,
                view[done:whole],
                self._fail,
                wait=wait,
            )
            if waiter is not None and later is not None:
                later.append(waiter)
            self._piece = last
        if whole < n:  # the start of the next piece; the rest of it waits in _pending
            out = self._inflate_piece()
            view[whole:] = out[: n - whole]
            self._pending = memoryview(out)[n - whole :]

    def readinto(self, view: memoryview, later: list[Callable[[], None]] | None = None) -> None:
        """Fill ``view`` (a byte view) with the next decoded bytes.

        With ``later``, a member deflated in pieces may return before ``view`` is
        filled: its pieces are inflated on the pool, and the callable appended to
        ``later`` waits for them (and raises their error).
        """
        n = view.nbytes
        if self._produced + n > self._entry.size:
            raise self._fail("holds fewer bytes than its contents need")
        if self._table is not None:
            self._readinto_pieces(view, later)
        elif self._whole is not None:
            start = self._pos - self._entry.data_offset
            if start + n > len(self._whole):
                raise self._fail("file ended early")
            view[:] = self._whole[start : start + n]
            self._pos += n
            self._crc = crc32(view, self._crc)
        elif self._inflater is None:
            done = 0
            while done < n:
                got = os.preadv(self._fd, [view[done:]], self._pos)
                if got <= 0:
                    raise self._fail("file ended early")
                done += got
                self._pos += got
            if self._chain is not None:
                self._chain.add(view)
            else:
                self._crc = crc32(view, self._crc)
        else:
            done = 0
            while done < n:
                if not self._pending:
                    self._pending = self._inflate(n - done)
                take = min(len(self._pending), n - done)
                view[done : done + take] = self._pending[:take]
                self._crc = crc32(self._pending[:take], self._crc)
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
                if self._compressed is not None:
                    start = self._pos - self._entry.data_offset
                    source = self._compressed[start : start + _CHUNK]
                else:
                    source = os.pread(self._fd, min(_CHUNK, self._end - self._pos), self._pos)
                if not source:
                    raise self._fail("file ended early")
                self._pos += len(source)
            try:
                out = self._inflater.decompress(source, limit)
            except _pieces.ZlibError as err:
                raise self._fail(f"corrupt compressed data ({err})") from None
            if out:
                return out
            if self._inflater.eof:
                raise self._fail("compressed data ended early")

    def finish(self, later: list[Callable[[], None]] | None = None) -> None:
        """Check that every byte was consumed and that the CRC matches."""
        if self._produced != self._entry.size:
            raise self._fail("holds more bytes than its contents need")
        if self._table is not None:
            # Every piece read was checked against its CRC, and the pieces' CRCs
            # against the member's when the table was read.
            if len(self._pending) or self._piece != self._table.count:
                raise self._fail("holds more bytes than its contents need")
            return
        if self._inflater is not None and (self._pending or self._inflater.unconsumed_tail):
            raise self._fail("holds more bytes than its contents need")
        if self._chain is not None and later is not None:
            later.append(self._check_chain)
            return
        crc = self._chain.result() if self._chain is not None else self._crc
        if crc != self._entry.crc:
            raise self._fail("CRC mismatch: the data is corrupt")

    def _check_chain(self) -> None:
        assert self._chain is not None
        if self._chain.result() != self._entry.crc:
            raise self._fail("CRC mismatch: the data is corrupt")
