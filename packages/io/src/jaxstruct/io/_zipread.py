"""A zip reader for untrusted files.

The central directory is parsed and every entry checked (method, encryption,
sizes, overlapping ranges, the local header) before any member data is read;
member data is then read straight into caller-provided buffers, its CRC
checked at the end.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import os
import struct
import zipfile
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

from jaxstruct.registry import SerializationError

from ._crc import CrcParts, crc32

__all__ = ["Entry", "MemberReader", "ZipIndex", "read_index"]

_STORED, _DEFLATED = 0, 8
_CHUNK = 4 << 20  # compressed bytes read at a time
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


@dataclasses.dataclass(frozen=True)
class ZipIndex:
    """The checked members of an archive, by name.

    ``data`` holds the whole archive when it was small enough to read with one
    system call (``data[0]`` is at file offset ``base``); members are then
    read from it instead of from the file.
    """

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


# (name, flag bits, method, compressed size, size, local header offset, CRC) per member.
_Record = tuple[str, int, int, int, int, int, int]
_EOCD = struct.Struct("<IHHHHIIH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_SIMPLE_MAX = 0xFFFF  # a count or size with all bits set defers to ZIP64 records
_ZIP_VERSION = 63  # the newest "version needed to extract" zipfile reads


def _simple_records(read: Any, file_size: int) -> list[_Record] | None:
    """The members of an archive laid out as export writes small ones, else ``None``.

    Simple means: no archive comment, no ZIP64 records, the central directory
    right before the end record, no extra fields in it, no NUL or backslash in
    a name, a format version zipfile knows. Anything else (or anything
    malformed) returns ``None`` and is left to :mod:`zipfile`, which knows
    every variant. ``read(offset, n)`` reads the archive.
    """
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
        fields = _CENTRAL.unpack_from(central, pos)
        sig, needed, flags, method, crc, csize, size = (fields[i] for i in (0, 2, 3, 4, 7, 8, 9))
        name_len, extra_len, comment_len, offset = fields[10], fields[11], fields[12], fields[16]
        if (
            sig != 0x02014B50
            or extra_len
            or (needed & 0xFF) > _ZIP_VERSION
            or 0xFFFFFFFF in (csize, size, offset)
        ):
            return None
        pos += _CENTRAL.size
        raw = bytes(central[pos : pos + name_len])
        pos += name_len + comment_len
        try:
            name = raw.decode("utf-8" if flags & 0x800 else "cp437")
        except UnicodeDecodeError:
            return None
        if "\0" in name or "\\" in name or pos > cd_size:
            return None
        records.append((name, flags, method, csize, size, offset, crc))
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
    return [
        (
            info.filename,
            info.flag_bits,
            info.compress_type,
            info.compress_size,
            info.file_size,
            info.header_offset,
            info.CRC,
        )
        for info in infos
    ]


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
    """Parse and check the central directory of the zip archive open at ``fd``.

    The archive spans ``file_size`` bytes from offset ``base`` (an archive
    stored inside another); entry offsets are returned relative to the file.
    An archive of at most ``_WHOLE_FILE`` bytes is read with one system call
    (or taken from ``data``, its bytes, when the caller has them) and kept in
    the index.

    Raises:
        SerializationError: the archive is malformed, encrypted, uses another
            compression method, names a member twice, has members that overlap
            or run past the end of the file, or claims an inflation ratio above
            ``max_ratio``.
    """
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
    for name, flags, method, csize, size, header_offset, crc in records:
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
        entries[name] = Entry(name, base + data_offset, csize, size, method, crc)
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
        self._pending = b""
        self._inflater = zlib.decompressobj(-15) if entry.method == _DEFLATED else None
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
        """Compute the CRC of a big stored member on the CRC threads, overlapping the reads.

        Only for a caller that reads into distinct memory it keeps until
        :meth:`finish` (a reused scratch buffer would be overwritten before
        it is checked). Returns whether the checks now run in the background.
        """
        if self._inflater is None and self._whole is None and self._entry.csize >= _OVERLAP_CRC:
            self._chain = CrcParts(self._crc)
        return self._chain is not None

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
        if self._whole is not None:
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
            except zlib.error as err:
                raise self._fail(f"corrupt compressed data ({err})") from None
            if out:
                return out
            if self._inflater.eof:
                raise self._fail("compressed data ended early")

    def finish(self, later: list[Callable[[], None]] | None = None) -> None:
        """Check that every byte was consumed and that the CRC matches.

        With ``later``, a CRC still being computed on the CRC threads is not
        waited for: its check is appended to ``later`` for the caller to run
        (before it hands out the data), so the next member is read meanwhile.
        """
        if self._produced != self._entry.size:
            raise self._fail("holds more bytes than its contents need")
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
