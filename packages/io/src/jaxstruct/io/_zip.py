"""Zip archives: a parallel writer (ZIP64, stored or deflated members) and a checked reader."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
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

from . import _budget, _pieces
from ._budget import Ticket
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


class _Source:
    """A member's content, piece by piece in order (one pass over ``chunks()``).

    Pieces hold ``piece`` bytes, but a first chunk shorter than a piece (a ``.npy``
    header) is a piece of its own, so that the array's bytes start a piece: a load
    inflates every piece of the array straight into its buffer.
    """

    def __init__(self, member: Member, piece: int) -> None:
        self.name = member.name
        self.stable = member.stable or member.parts is not None
        self._chunks: Iterator[Chunk] = iter(
            member.parts if member.parts is not None else member.chunks()
        )
        self._rest = memoryview(b"")  # what is left of the current chunk
        size = member.size
        first = piece
        if size:
            self._rest = self._next_chunk()
            if 0 < self._rest.nbytes < piece < size:
                first = self._rest.nbytes
        self.lengths = [min(first, size)] if size else [0]
        at = self.lengths[0]
        while at < size:
            self.lengths.append(min(piece, size - at))
            at += piece

    def _next_chunk(self) -> memoryview:
        chunk = next(self._chunks, None)
        if chunk is None:
            return memoryview(b"")
        return memoryview(chunk).cast("B")

    def views(self, n: int) -> Iterator[memoryview]:
        """The next ``n`` bytes, as views of the member's own buffers (each valid until
        the next is asked for, unless the member is ``stable``)."""
        while n:
            if not self._rest.nbytes:
                self._rest = self._next_chunk()
                if not self._rest.nbytes:
                    raise _short(self.name)
            take = min(n, self._rest.nbytes)
            yield self._rest[:take]
            self._rest = self._rest[take:]
            n -= take

    def gather(self, n: int) -> bytearray:
        """The next ``n`` bytes, copied into a buffer of their own."""
        out = bytearray(n)
        at = 0
        for view in self.views(n):
            out[at : at + view.nbytes] = view
            at += view.nbytes
        return out

    def end(self) -> None:
        """Check that the content held no more bytes than announced."""
        if self._rest.nbytes or any(memoryview(c).nbytes for c in self._chunks):
            raise _short(self.name)

    def close(self) -> None:
        """Let go of the content (a stream from a device ends its copies)."""
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
        self._rest = memoryview(b"")


def _short(name: str) -> SerializationError:
    return SerializationError(f"member {name!r}: its content does not have the size it announced")


def _strategy(member: Member, compression: str) -> int | None:
    """The DEFLATE strategy of ``member`` (from a sample), or ``None`` to store it."""
    tiny = compression == "auto" and member.size < _TINY and not member.text
    if compression == "none" or not member.size or tiny:
        return None
    return _choose_strategy(_first_sample(member), member.text, compression == "auto")


def _prepare(member: Member, compression: str) -> _Prepared:
    """Prepare ``member`` whole on this thread: its CRC, and its payload when deflated
    (small members, and the outer zip's manifest, written with a header made first)."""
    strategy = _strategy(member, compression)
    size = member.size
    if strategy is None and member.once:  # its CRC is computed while it is written
        return _Prepared(0, size, _STORED, None, size, 0, crc_later=True)
    if strategy is None:
        crc = _crc_of(member.parts if member.parts is not None else member.chunks())
        return _Prepared(crc, size, _STORED, None, size, crc)
    level = 6 if member.text else 1
    piece = _pieces.piece_size(size)
    source = _Source(member, piece)
    crc = payload_crc = csize = 0
    payload: list[bytes] = []
    lengths, piece_crcs = [], []
    for i, n in enumerate(source.lengths):
        c, chunks, m, dc = _pieces.deflate_piece(
            list(source.views(n)) if source.stable else [source.gather(n)],
            strategy,
            level,
            i == len(source.lengths) - 1,
        )
        crc = crc32_combine(crc, c, n)
        payload_crc = crc32_combine(payload_crc, dc, m)
        csize += m
        payload += chunks
        lengths.append(m)
        piece_crcs.append(c)
    source.end()
    # Stored instead when deflating saved nothing, unless the content is gone
    # (a ``once`` member: stored, it would be copied from its device again).
    if compression != "deflate" and csize >= size and not member.once:
        return _Prepared(crc, size, _STORED, None, size, crc)
    table = b""
    if len(lengths) > 1:
        table = _pieces.encode_table(piece, source.lengths[0], lengths, piece_crcs)
    return _Prepared(crc, size, _DEFLATED, payload, csize, payload_crc, table)


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


class _Out:
    """The archive being written: small writes gathered in a buffer that goes out in big
    writes, the offset and CRC of every byte handed over, headers patched afterwards."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.limit = _BUFFER  # the buffer's size (its bytes come from the host budget)
        self.offset = 0  # bytes handed to write(), buffered or not
        self.crc = 0  # of those bytes, where the caller keeps it up to date

    def flush(self) -> None:
        if self.buffer:
            _write_fully(self.stream, self.buffer)
            self.buffer.clear()

    def write(self, data: Chunk) -> None:
        n = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        if n >= min(_DIRECT_WRITE, self.limit):
            self.flush()
            _write_fully(self.stream, data)
        else:
            if len(self.buffer) + n > self.limit:
                self.flush()
            self.buffer.extend(data)
        self.offset += n

    def write_small(self, data: bytes) -> None:
        self.crc = crc32(data, self.crc)
        self.write(data)

    def _base(self) -> int:
        """Where the archive starts in the stream (its position minus what went out)."""
        return self.stream.tell() - (self.offset - len(self.buffer))

    def patch(self, start: int, header: bytes) -> None:
        """Write ``header`` over the bytes at ``start`` (a member's local header)."""
        flushed = self.offset - len(self.buffer)
        if start >= flushed:  # still in the buffer
            at = start - flushed
            self.buffer[at : at + len(header)] = header
            return
        base = self._base()
        self.flush()
        _write_at(self.stream, base + start, header)

    def rewind(self, start: int, crc: int) -> None:
        """Drop everything written from ``start`` on (``crc`` was the CRC up to there)."""
        flushed = self.offset - len(self.buffer)
        if start >= flushed:
            del self.buffer[start - flushed :]
        else:
            base = self._base()
            self.flush()
            self.stream.seek(base + start)
            self.stream.truncate()
        self.offset, self.crc = start, crc

    def write_counted(self, chunks: Iterable[Chunk]) -> int:
        """Write ``chunks`` and return their CRC, each big chunk's computed on a CRC thread
        while it is written (both release the GIL)."""
        crc = 0
        for chunk in chunks:
            n = len(chunk) if isinstance(chunk, bytes) else memoryview(chunk).nbytes
            if n < _OVERLAP_CRC:
                crc = crc32(chunk, crc)
                self.write(chunk)
                continue
            part = submit(crc_pool, crc32, chunk)
            try:
                self.write(chunk)
            finally:
                value = part.result()
            crc = crc32_combine(crc, value, n)
        return crc


def _slot(n: int, *, copied: bool) -> int:
    """The host bytes a piece of ``n`` bytes deflated on the pool holds until it is written:
    its output, the compressor, and its input when it was copied (from a device, or from
    buffers its member reuses) rather than viewed where it lies."""
    return _pieces.deflate_bound(n) + _pieces.COMPRESSOR_BYTES + (n if copied else 0)


@dataclasses.dataclass
class _Job:
    """Work started on the pool for one piece of a member: its CRC, or its deflated bytes."""

    member: int
    future: concurrent.futures.Future[Any]
    cost: int  # bytes of the writer's ticket it holds until its result is written


class _Plan:
    """How one member of at least ``_INLINE`` bytes is written, and how far its pieces got."""

    def __init__(self, member: Member, compression: str) -> None:
        self.member = member
        self.strategy = _strategy(member, compression)
        self.level = 6 if member.text else 1
        self.piece = _pieces.piece_size(member.size)
        # A stored member copied from a device is written as it is copied, its CRC later.
        self.streamed = self.strategy is None and member.once
        # A stored member whose chunks() reuses its buffers: one pass for the CRC.
        self.one_pass = self.strategy is None and not member.stable and member.parts is None
        self.source: _Source | None = None
        self.opened = False
        self.count = 0  # pieces, once opened
        self.started = 0  # pieces started (on the pool or on the writer's thread)
        self.stream_ticket: Ticket | None = None  # a device member's copies, when deflated

    def open(self) -> None:
        """Start reading the content (its pieces known from then on)."""
        if self.opened:
            return
        self.opened = True
        if self.one_pass:
            self.count = 1
            return
        with self.copies():
            self.source = _Source(self.member, self.piece)
        self.count = len(self.source.lengths)

    def copies(self) -> contextlib.AbstractContextManager[Any]:
        """Where this member's copies from a device take their host memory."""
        if self.stream_ticket is None:
            return contextlib.nullcontext()
        return _budget.within(self.stream_ticket)

    @property
    def produced(self) -> bool:
        return self.opened and self.started == self.count

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
        if self.stream_ticket is not None:
            self.stream_ticket.end()
            self.stream_ticket = None


class _Writer:
    """The members of one archive in order, the pool working ahead of the one written.

    Everything the writer holds comes from its ticket of the host budget: the
    buffer gathering small writes, the copies of members from devices (their
    streams take their share of it), and work run ahead on the pool (at most
    ``2 * WORKERS`` pieces: CRCs of stored members, deflated pieces): a deflated
    piece holds its output (and its input, when copied from a device or from
    reused buffers) until it is written. A piece that finds no room is deflated
    on the writer's thread instead, its output written as it comes. Members
    copied from a device are planned when their turn comes, so that only one of
    them is copied at a time.
    """

    def __init__(self, members: Sequence[Member], compression: str, out: _Out) -> None:
        self.members = members
        self.compression = compression
        self.out = out
        heavy = [m for m in members if m.size >= _INLINE]
        self.parallel = WORKERS > 1 and sum(m.size for m in heavy) >= _PARALLEL_BYTES
        self.window: collections.deque[_Job] = collections.deque()
        self.plans: dict[int, _Plan] = {}
        self.ahead = 0  # the first member whose pieces are not all started
        self.current = -1  # the member being written
        # The buffer, one compressor on this thread, and the pieces on the pool.
        budget = _budget.host_budget()
        inline = _pieces.COMPRESSOR_BYTES + 2 * _pieces.FEED if compression != "none" else 0
        want = _BUFFER + inline
        if self.parallel and compression != "none":
            want += 2 * WORKERS * _slot(_pieces.PIECE, copied=True)
        if any(m.once for m in members):
            want = budget  # and the copies, the more the faster
        least = min(want, budget // 4)
        self.ticket: Ticket | None = _budget.take(want, least)
        size = self.ticket.size
        # The buffer of small writes, and what deflating on this thread holds (a compressor,
        # an input and an output slice), each a part of the ticket at most.
        out.limit = self.ticket.take_up_to(min(_BUFFER, size // 8))
        self.inline = self.ticket.take_up_to(min(inline, size // 4))
        # Room kept for copies and pieces when the ticket is trimmed for other threads.
        self.keep = max(least // 2, 1)

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        for job in self.window:
            job.future.cancel()
        # Work already running ends before its buffers are given back.
        concurrent.futures.wait([job.future for job in self.window])
        for job in self.window:
            if job.cost and self.ticket is not None:
                self.ticket.free(job.cost)
        self.window.clear()
        for plan in self.plans.values():
            plan.close()
        self.plans.clear()
        if self.ticket is not None:
            self.ticket.free(self.out.limit + self.inline)
            self.ticket.end()

    def write(self, i: int) -> bytes:
        """Write member ``i``; return its central directory entry."""
        self.current = i
        # Copies from devices made meanwhile take their host memory from the writer's ticket.
        with self._within():
            entry = self._write(i)
        self.ahead = max(self.ahead, i + 1)
        if self.ticket is not None:
            self.ticket.rebalance(self.ticket.held + self.keep)
        return entry

    def _write(self, i: int) -> bytes:
        member = self.members[i]
        if member.size < _INLINE:
            self.ahead = max(self.ahead, i + 1)
            return self._write_prepared(member, _prepare(member, self.compression))
        plan = self._plan(i)
        assert plan is not None
        try:
            if plan.streamed:
                entry = self._write_streamed(member)
            elif plan.strategy is None:
                entry = self._write_stored(i, plan)
            else:
                entry = self._write_deflated(i, plan)
        finally:
            plan.close()
            del self.plans[i]
        return entry

    def _plan(self, i: int) -> _Plan | None:
        """Member ``i``'s plan, made now if need be; ``None`` for a member copied from a
        device that is not being written yet."""
        plan = self.plans.get(i)
        if plan is None:
            member = self.members[i]
            if member.once and i != self.current:
                return None
            with self._within():  # a device member's sample is copied within it
                plan = self.plans[i] = _Plan(member, self.compression)
            if member.once and plan.strategy is not None and self.ticket is not None:
                # Its copies get what the pool's pieces leave (a quarter at least).
                room = self.ticket.room
                slot = _slot(plan.piece, copied=True)
                jobs = min(2 * WORKERS, (room - room // 4) // slot)
                share = self.ticket.take_up_to(room - jobs * slot)
                plan.stream_ticket = Ticket(
                    share, self.ticket, self.ticket.account, self.ticket.limit
                )
        return plan

    def _within(self) -> contextlib.AbstractContextManager[Any]:
        if self.ticket is None:
            return contextlib.nullcontext()
        return _budget.within(self.ticket)

    def fill(self) -> None:
        """Start work ahead on the pool while there is room, never waiting."""
        if not self.parallel:
            return
        with self._within():
            self._fill()

    def _fill(self) -> None:
        while len(self.window) < 2 * WORKERS and self.ahead < len(self.members):
            i = self.ahead
            if self.members[i].once and i != self.current:
                return  # copied from a device: planned when its turn comes
            if self.members[i].size < _INLINE:
                self.ahead += 1
                continue
            plan = self._plan(i)
            if plan is None or plan.streamed:
                return
            plan.open()
            if plan.produced:
                self.ahead += 1
                continue
            job = self._start(i, plan)
            if job is None:
                return
            self.window.append(job)

    def _start(self, i: int, plan: _Plan) -> _Job | None:
        """Start the next piece of member ``i`` on the pool (``None``: no room)."""
        member = plan.member
        if plan.one_pass:
            plan.started = 1
            return _Job(i, submit(pool, _crc_of, member.chunks()), 0)
        source = plan.source
        assert source is not None
        k = plan.started
        n = source.lengths[k]
        if plan.strategy is None:  # in memory: views of it
            plan.started += 1
            return _Job(i, submit(pool, _crc_of, list(source.views(n))), 0)
        cost = _slot(n, copied=member.once or not source.stable)
        if self.ticket is None or not self.ticket.take(cost):
            return None
        try:
            with plan.copies():
                segments: Sequence[Chunk] = (
                    list(source.views(n))
                    if source.stable and not member.once
                    else [memoryview(source.gather(n))]
                )
        except BaseException:
            self.ticket.free(cost)
            raise
        plan.started += 1
        last = plan.started == plan.count
        future = submit(pool, _pieces.deflate_piece, segments, plan.strategy, plan.level, last)
        return _Job(i, future, cost)

    def _results(self, i: int, plan: _Plan) -> Iterator[tuple[int, list[bytes], int, int]]:
        """Each piece's ``(CRC, deflated chunks still to write, their size, their CRC)`` in
        order (for a stored member: its CRC, no chunks), from the pool or made here."""
        plan.open()
        source = plan.source
        for k in range(plan.count):
            self.fill()
            if self.window and self.window[0].member == i:
                job = self.window.popleft()
                try:
                    found = job.future.result()
                    yield (found, [], 0, 0) if plan.strategy is None else found
                finally:
                    if job.cost:
                        assert self.ticket is not None
                        self.ticket.free(job.cost)
                continue
            assert plan.started == k  # no piece of this member is on the pool
            plan.started += 1
            if source is None:  # one pass
                yield _crc_of(plan.member.chunks()), [], 0, 0
                continue
            n = source.lengths[k]
            if plan.strategy is None:
                yield _crc_of(source.views(n)), [], 0, 0
                continue
            # No room ahead: deflated here, written as it comes.
            deflater = _pieces.Deflater(plan.strategy, plan.level, self.out.write)
            with plan.copies():
                for view in source.views(n):
                    deflater.feed(view)
            deflater.finish(k == plan.count - 1)
            yield deflater.crc, [], deflater.out_size, deflater.out_crc
        if source is not None:
            source.end()

    def _write_prepared(self, member: Member, prep: _Prepared) -> bytes:
        """Write a member whose CRC and payload are known: header first."""
        out = self.out
        name = member.name.encode("utf-8")
        zip64 = prep.size >= _ZIP64_LIMIT or prep.csize >= _ZIP64_LIMIT
        if prep.crc_later:
            return self._write_streamed(member)
        start = out.offset
        out.write_small(_local_header(name, prep, zip64))
        payload = prep.payload if prep.payload is not None else member.chunks()
        if prep.csize <= _TINY:
            for chunk in payload:
                out.crc = crc32(chunk, out.crc)
                out.write(chunk)
        else:
            for chunk in payload:
                out.write(chunk)
            out.crc = crc32_combine(out.crc, prep.payload_crc, prep.csize)
        return _central_entry(name, prep, start, zip64)

    def _write_streamed(self, member: Member) -> bytes:
        """Write a stored member as it comes, its CRC computed meanwhile, then patched in."""
        out = self.out
        name = member.name.encode("utf-8")
        size = member.size
        zip64 = size >= _ZIP64_LIMIT
        prep = _Prepared(0, size, _STORED, None, size, 0)
        start, before = out.offset, out.crc
        out.write(_local_header(name, prep, zip64))
        data_at = out.offset
        prep.crc = prep.payload_crc = out.write_counted(member.chunks())
        if out.offset - data_at != size:
            raise _short(member.name)
        header = _local_header(name, prep, zip64)
        out.patch(start, header)
        out.crc = crc32_combine(crc32(header, before), prep.crc, size)
        return _central_entry(name, prep, start, zip64)

    def _write_stored(self, i: int, plan: _Plan) -> bytes:
        """Write a stored member whose CRC (computed first) goes into its header."""
        crc = 0
        size = plan.member.size
        for k, (c, _, _, _) in enumerate(self._results(i, plan)):
            crc = crc32_combine(crc, c, plan.source.lengths[k] if plan.source else size)
        return self._write_prepared(plan.member, _Prepared(crc, size, _STORED, None, size, crc))

    def _write_deflated(self, i: int, plan: _Plan) -> bytes:
        """Write a member deflated in pieces as they come: a header first, patched once
        its CRC and compressed size are known."""
        member, out = plan.member, self.out
        name = member.name.encode("utf-8")
        size = member.size
        plan.open()
        source = plan.source
        assert source is not None
        bound = sum(_pieces.deflate_bound(n) for n in source.lengths)
        zip64 = size >= _ZIP64_LIMIT or bound >= _ZIP64_LIMIT
        start, before = out.offset, out.crc
        out.write(_local_header(name, _Prepared(0, size, _DEFLATED, None, 0, 0), zip64))
        crc = payload_crc = csize = 0
        lengths, crcs = [], []
        for k, (c, chunks, m, dc) in enumerate(self._results(i, plan)):
            for chunk in chunks:
                out.write(chunk)
            del chunks  # its ticket bytes go back when the next piece is asked for
            crc = crc32_combine(crc, c, source.lengths[k])
            payload_crc = crc32_combine(payload_crc, dc, m)
            csize += m
            lengths.append(m)
            crcs.append(c)
        if self.compression != "deflate" and csize >= size and not member.once:
            # Deflating saved nothing: stored instead (its content is still in memory).
            out.rewind(start, before)
            return self._write_prepared(member, _Prepared(crc, size, _STORED, None, size, crc))
        table = b""
        if len(lengths) > 1:
            table = _pieces.encode_table(plan.piece, source.lengths[0], lengths, crcs)
        prep = _Prepared(crc, size, _DEFLATED, None, csize, payload_crc, table)
        header = _local_header(name, prep, zip64)
        out.patch(start, header)
        out.crc = crc32_combine(crc32(header, before), payload_crc, csize)
        return _central_entry(name, prep, start, zip64)


def write_zip(
    stream: BinaryIO,
    members: Sequence[Member],
    *,
    compression: str,
    after_member: Callable[[str], None] | None = None,
) -> tuple[int, int]:
    """Write ``members`` as a zip archive to ``stream``, compressing in parallel; return the
    bytes written and their CRC-32. ``stream`` must be seekable (headers are patched)."""
    if compression != "deflate" and _all_tiny(members):
        return _write_tiny(stream, members, after_member)
    out = _Out(stream)
    central: list[bytes] = []
    with _Writer(members, compression, out) as writer:
        for i, member in enumerate(members):
            central.append(writer.write(i))
            if after_member is not None:
                after_member(member.name)
        cd_offset = out.offset
        for entry in central:
            out.write_small(entry)
        out.write_small(_end_records(len(central), cd_offset, out.offset - cd_offset))
        out.flush()
    return out.offset, out.crc


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
