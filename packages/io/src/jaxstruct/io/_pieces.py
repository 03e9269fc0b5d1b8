"""DEFLATE in independent pieces: big members compressed and inflated on every core.

A member larger than one piece is deflated as consecutive pieces, each by a
fresh compressor (no back-reference crosses a piece boundary), every piece
but the last ending with a full flush, so their concatenation is one valid
DEFLATE stream that any zip reader (``numpy.load`` included) inflates as
usual. The member's central directory entry carries an extra field block
(``EXTRA_ID``, which other readers skip) listing each piece's compressed
length and the CRC-32 of its decoded bytes: our reader inflates the pieces
on the worker pool, straight into the destination, and checks each piece's
CRC; the pieces' CRCs must combine into the member's CRC, so the table
itself is checked against the zip's own record of the data.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from zlib_ng import zlib_ng
from zlib_ng.zlib_ng import crc32, crc32_combine

from ._process import WORKERS, pool, submit

# Smallest uncompressed piece: big enough that handing it to a thread costs
# little against inflating it (about 2-5 ms per MiB on one core), small enough
# that a member of a few MiB already uses every core.
PIECE = 1 << 20
# Pieces per member at most: the piece size doubles beyond this many, so the
# table (8 bytes a piece) stays well inside an extra field's 65,535 bytes.
MAX_PIECES = 4096
# The extra field block of a pieced member. IDs are 16-bit and readers skip
# blocks they do not know (APPNOTE 4.5.2); this one ("jx") is registered to no one.
EXTRA_ID = 0x786A
_VERSION = 1
# version, log2 of the piece size, number of pieces, decoded bytes of the first piece
_HEAD = struct.Struct("<BBII")
_ENTRY = struct.Struct("<II")  # compressed length, CRC-32 of the decoded piece

Chunk = bytes | bytearray | memoryview
# zlib-ng's stubs declare its error class as an instance.
ZlibError: type[Exception] = zlib_ng.error  # pyright: ignore[reportAssignmentType]


def piece_size(size: int) -> int:
    """The uncompressed size of each piece (but the last) of a member of ``size`` bytes."""
    piece = PIECE
    while piece * MAX_PIECES < size:
        piece *= 2
    return piece


# Each piece's input reaches the compressor in slices of this many bytes, counted from the
# piece's first byte: zlib-ng's output depends on where its input is cut (its default
# strategy does), so cutting it the same way whatever the source's own boundaries makes
# a member's bytes the same whether it was compressed from memory, from a device's
# copies or while streaming.
FEED = 64 << 10


#: Host memory one compressor holds while it works (zlib-ng's state at levels 1 and 6:
#: about 340 KiB measured here), besides its input and output.
COMPRESSOR_BYTES = 384 << 10


def deflate_bound(n: int) -> int:
    """Bytes that deflating ``n`` bytes gives at most (zlib-ng's fastest level expands
    incompressible data by at most an eighth, plus block headers and the final flush)."""
    return n + (n >> 3) + 256


class Deflater:
    """Deflates one piece with a fresh compressor; see :func:`deflate_piece`.

    ``emit`` receives each compressed chunk as it is made (a writer streaming the
    piece); without it they are kept in :attr:`chunks`.
    """

    def __init__(
        self, strategy: int, level: int, emit: Callable[[bytes], None] | None = None
    ) -> None:
        self._comp = zlib_ng.compressobj(level, zlib_ng.DEFLATED, -15, 8, strategy)
        self._emit_to = emit
        self._pending = bytearray()  # input short of a whole FEED slice
        self.chunks: list[bytes] = []
        self.crc = 0  # of the input
        self.size = 0  # of the input
        self.out_crc = 0
        self.out_size = 0

    def feed(self, data: Chunk) -> None:
        """Add the piece's next bytes."""
        view = memoryview(data).cast("B")
        self.crc = crc32(view, self.crc)
        self.size += view.nbytes
        pending = self._pending
        if pending:
            take = FEED - len(pending)
            pending += view[:take]
            view = view[take:]
            if len(pending) < FEED:
                return
            self._compress(pending)
            pending.clear()
        while view.nbytes >= FEED:
            self._compress(view[:FEED])
            view = view[FEED:]
        if view.nbytes:
            pending += view

    def finish(self, last: bool) -> None:
        """End the piece: a full flush, or the end of the stream for the member's last one."""
        if self._pending:
            self._compress(self._pending)
            self._pending = bytearray()
        self._emit(self._comp.flush(zlib_ng.Z_FINISH if last else zlib_ng.Z_FULL_FLUSH))

    def _compress(self, data: Chunk) -> None:
        out = self._comp.compress(data)
        if out:
            self._emit(out)

    def _emit(self, out: bytes) -> None:
        self.out_crc = crc32(out, self.out_crc)
        self.out_size += len(out)
        if self._emit_to is not None:
            self._emit_to(out)
        else:
            self.chunks.append(out)


def deflate_piece(
    segments: Sequence[Chunk], strategy: int, level: int, last: bool
) -> tuple[int, list[bytes], int, int]:
    """Deflate one piece (its bytes given as ``segments``) with a fresh compressor.

    Returns the CRC-32 of the piece, its raw DEFLATE bytes as chunks (ending with a
    full flush unless it is the member's ``last`` piece, which finishes the stream),
    their total length and their CRC-32. zlib-ng releases the GIL while it
    compresses and checksums.
    """
    deflater = Deflater(strategy, level)
    for segment in segments:
        deflater.feed(segment)
    deflater.finish(last)
    return deflater.crc, deflater.chunks, deflater.out_size, deflater.out_crc


def encode_table(piece: int, first: int, lengths: Sequence[int], crcs: Sequence[int]) -> bytes:
    """The extra field block that records a pieced member's pieces.

    ``first`` is the decoded size of the first piece (a ``.npy`` header is a piece
    of its own, so that the array's bytes start a piece); every later piece holds
    ``piece`` bytes but the last. ``lengths`` are the compressed sizes.
    """
    body = _HEAD.pack(_VERSION, piece.bit_length() - 1, len(lengths), first) + b"".join(
        _ENTRY.pack(n, c) for n, c in zip(lengths, crcs, strict=True)
    )
    return struct.pack("<HH", EXTRA_ID, len(body)) + body


def find_block(extra: bytes) -> tuple[bytes, bool] | None:
    """Our block's body in an extra field, and whether other blocks are there too.

    ``None`` when the field is malformed (a block running past its end).
    """
    ours, others, pos = b"", False, 0
    while pos + 4 <= len(extra):
        kind, n = struct.unpack_from("<HH", extra, pos)
        if pos + 4 + n > len(extra):
            return None
        if kind == EXTRA_ID:
            ours = bytes(extra[pos + 4 : pos + 4 + n])
        else:
            others = True
        pos += 4 + n
    return ours, others


@dataclass(frozen=True)
class Table:
    """The pieces of one member: decoded size of each, compressed offsets, CRCs."""

    piece: int  # decoded bytes of every piece but the first and the last
    first: int  # decoded bytes of the first piece
    size: int  # decoded bytes of the member
    starts: tuple[int, ...]  # compressed offset of each piece in the member, then the end
    crcs: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.crcs)

    def length(self, i: int) -> int:
        """Decoded bytes of piece ``i``."""
        if i == 0:
            return self.first
        return min(self.piece, self.size - self.first - (i - 1) * self.piece)


def parse_table(
    body: bytes, size: int, csize: int, crc: int, fail: Callable[[str], Exception]
) -> Table:
    """Check a piece table against the member's sizes and CRC, and return it."""
    problem = "its piece table is corrupt (it does not match the member's sizes and CRC)"
    if len(body) < _HEAD.size:
        raise fail(problem)
    version, log2, count, first = _HEAD.unpack_from(body)
    if version != _VERSION:
        raise fail(f"its piece table has version {version}; this jaxstruct reads {_VERSION}")
    piece = 1 << log2 if log2 < 63 else 0
    if (
        len(body) != _HEAD.size + count * _ENTRY.size
        or piece < PIECE
        or not 0 < first <= min(piece, size - 1)
        or count != 1 + -(-(size - first) // piece)
    ):
        raise fail(problem)
    shape = Table(piece, first, size, (), ())
    starts = [0]
    crcs: list[int] = []
    combined = 0
    for i in range(count):
        n, c = _ENTRY.unpack_from(body, _HEAD.size + i * _ENTRY.size)
        starts.append(starts[-1] + n)
        crcs.append(c)
        combined = crc32_combine(combined, c, shape.length(i))
    if starts[-1] != csize or combined != crc:
        raise fail(problem)
    return Table(piece, first, size, tuple(starts), tuple(crcs))


_local = threading.local()


def scratch(n: int) -> memoryview:
    """A buffer of ``n`` bytes owned by this thread, valid until its next call here.

    Up to ``2 * PIECE`` bytes are kept for the thread's next call (the compressed
    pieces of members up to 4 GiB); a bigger one is made for this call alone.
    """
    if n > 2 * PIECE:
        return memoryview(bytearray(n))
    buf: bytearray | None = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = bytearray(2 * PIECE)
    return memoryview(buf)[:n]


def inflate_piece(source: Chunk, table: Table, i: int, fail: Callable[[str], Exception]) -> bytes:
    """Inflate piece ``i`` from its compressed bytes and check its length and CRC."""
    want = table.length(i)
    inflater = zlib_ng.decompressobj(-15)
    try:
        out = inflater.decompress(source, want)
        rest = b"" if inflater.eof else inflater.flush()
    except ZlibError as err:
        raise fail(f"piece {i} holds corrupt compressed data ({err})") from None
    last = i == table.count - 1
    if (
        len(out) != want
        or rest
        or inflater.unconsumed_tail
        or inflater.unused_data
        or inflater.eof != last
    ):
        raise fail(f"piece {i} does not inflate to its {want} bytes: the data is corrupt")
    if crc32(out) != table.crcs[i]:
        raise fail(f"piece {i}: CRC mismatch: the data is corrupt")
    return out


def inflate_into(
    read: Callable[[int, int], Chunk],
    table: Table,
    first: int,
    dest: memoryview,
    fail: Callable[[str], Exception],
    *,
    wait: bool = True,
) -> Callable[[], None] | None:
    """Inflate pieces ``first``, ``first + 1``, ... into ``dest`` (a byte view they fill).

    ``read(offset, n)`` returns ``n`` compressed bytes at ``offset`` in the member.
    The pool's threads and this one take pieces in turn; this returns once every
    piece is in place and none of those threads still touches ``dest``, and raises
    the first error met (the others stop at their next piece). With ``wait=False``
    it returns at once, the pool at work, and gives the function that does the
    waiting (this thread then takes the pieces no thread has started).
    """
    bounds: list[tuple[int, int]] = []  # (piece, offset in dest)
    at = 0
    i = first
    while at < dest.nbytes:
        bounds.append((i, at))
        at += table.length(i)
        i += 1
    if at != dest.nbytes:  # pragma: no cover - the caller hands whole pieces
        raise AssertionError("inflate_into needs whole pieces")
    target = np.frombuffer(dest, np.uint8)
    lock = threading.Lock()
    state: dict[str, Any] = {"next": 0, "busy": 0, "error": None}
    idle = threading.Condition(lock)

    def run() -> None:
        while True:
            with lock:
                k = state["next"]
                if k >= len(bounds) or state["error"] is not None:
                    return
                state["next"] = k + 1
                state["busy"] += 1
            try:
                piece, offset = bounds[k]
                source = read(table.starts[piece], table.starts[piece + 1] - table.starts[piece])
                out = inflate_piece(source, table, piece, fail)
                # numpy copies without holding the GIL; a memoryview assignment would hold it.
                target[offset : offset + len(out)] = np.frombuffer(out, np.uint8)
            except BaseException as err:
                with lock:
                    if state["error"] is None:
                        state["error"] = err
            finally:
                with idle:
                    state["busy"] -= 1
                    idle.notify_all()

    def finish() -> None:
        run()
        # Helpers that never started find no piece left; only those still working are
        # waited for, so a read made on a pool thread cannot wait on its own queue.
        with idle:
            while state["busy"]:
                idle.wait()
        if state["error"] is not None:
            raise state["error"]

    helpers = len(bounds) if not wait else len(bounds) - 1
    for _ in range(min(WORKERS, helpers)):
        submit(pool, run)
    if not wait:
        return finish
    finish()
    return None
