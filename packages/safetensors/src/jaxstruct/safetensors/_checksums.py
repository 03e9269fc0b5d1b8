"""The checksums of a safetensors file jaxstruct writes: a CRC-32 per piece of each tensor.

The header's ``__metadata__`` entry ``jaxstruct.checksums`` is a JSON string::

    {"version": 1, "piece": 1048576, "header": "89abcdef",
     "tensors": {"params.w": "0123abcd4567ef01...", ...}}

``tensors`` holds, per tensor, the CRC-32 of each ``piece`` bytes of its data
(counted from the tensor's first byte; the last piece may be shorter), as 8
hex digits each, so a read of any byte range checks only the pieces it
touches. ``header`` is the CRC-32 of the rest of the header (every other
metadata entry, jaxstruct's manifest included, and each tensor's dtype and
shape) in a canonical JSON form, so that a changed byte anywhere in
the file is found. The CRCs have fixed widths: a writer that learns them
while it writes the data rewrites the header in place, same length.

A second entry, ``jaxstruct.checked`` (:data:`MARK_KEY`), marks the file as
written with checksums. No single flipped bit erases both keys, so a file
whose checksums entry was lost or renamed (one flipped bit in its key) is
still known for one of jaxstruct's, and refused (:func:`marks`); the mark
itself is covered by the header's CRC. A key one bit away from either name
counts as that mark too, which also guards files written before the mark.

Files other tools wrote carry neither: they load unchecked.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from jaxstruct.io import parse_json, submit_to_workers
from jaxstruct.registry import SerializationError

# zlib-ng's CRC-32 runs at 20-30 GB/s here (the stdlib's zlib at 3-4) and releases the GIL.
from zlib_ng.zlib_ng import crc32

__all__ = [
    "CHECKSUMS_KEY",
    "MARK_KEY",
    "MARK_VALUE",
    "PIECE_BYTES",
    "Checker",
    "Checksums",
    "CrcStream",
    "decode_checksums",
    "encode_checksums",
    "header_crc",
    "marks",
    "piece_crcs",
]

#: The ``__metadata__`` entry holding the checksums.
CHECKSUMS_KEY = "jaxstruct.checksums"
#: The ``__metadata__`` entry that marks a file written with checksums, and its value.
MARK_KEY = "jaxstruct.checked"
MARK_VALUE = "crc32"
#: Bytes of tensor data per CRC.
PIECE_BYTES = 1 << 20
_VERSION = 1


def _bytes_of(data: Any) -> memoryview:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
    return memoryview(data).cast("B")


def piece_crcs(data: Any, piece: int) -> list[int]:
    """The CRC-32 of each ``piece`` bytes of ``data`` (a C-contiguous buffer)."""
    view = _bytes_of(data)
    return [crc32(view[at : at + piece]) for at in range(0, len(view), piece)]


class CrcStream:
    """The piece CRCs of one tensor whose bytes arrive in several blocks, in order."""

    def __init__(self, piece: int) -> None:
        self.piece = piece
        self.crcs: list[int] = []
        self._crc = 0
        self._filled = 0

    def feed(self, data: Any) -> None:
        """Add the next bytes of the tensor."""
        view = _bytes_of(data)
        at = 0
        while at < len(view):
            take = min(len(view) - at, self.piece - self._filled)
            self._crc = crc32(view[at : at + take], self._crc)
            self._filled += take
            at += take
            if self._filled == self.piece:
                self.crcs.append(self._crc)
                self._crc, self._filled = 0, 0

    def result(self) -> list[int]:
        """The CRCs of every piece, the last (shorter) one included."""
        return self.crcs + ([self._crc] if self._filled else [])


def header_crc(metadata: Mapping[str, str], tensors: Iterable[tuple[str, Any, Any]]) -> int:
    """The CRC-32 of the header's content: the metadata (but the checksums) and each
    tensor's ``(name, NumPy dtype, shape)``.

    Offsets are left out (the library's writer orders tensors its own way): a changed
    offset is found anyway, as a tensor whose byte range no longer fits its dtype and shape.
    """
    document = [
        sorted((k, v) for k, v in metadata.items() if k != CHECKSUMS_KEY),
        sorted(
            [name, np.dtype(dtype).str, [int(n) for n in shape]] for name, dtype, shape in tensors
        ),
    ]
    return crc32(json.dumps(document, separators=(",", ":")).encode("utf-8"))


def encode_checksums(header: int, piece: int, tensors: Mapping[str, Sequence[int]]) -> str:
    """The ``jaxstruct.checksums`` entry (its length depends only on the piece counts)."""
    return json.dumps(
        {
            "version": _VERSION,
            "piece": piece,
            "header": f"{header:08x}",
            "tensors": {name: "".join(f"{c:08x}" for c in crcs) for name, crcs in tensors.items()},
        },
        separators=(",", ":"),
    )


def _one_bit_from(key: str, name: bytes) -> bool:
    """Whether ``key`` is ``name`` with exactly one bit flipped."""
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) != len(name):
        return False
    return sum((a ^ b).bit_count() for a, b in zip(raw, name, strict=True)) == 1


_MARK_NAMES = (CHECKSUMS_KEY.encode(), MARK_KEY.encode())


def marks(metadata: Mapping[str, str]) -> list[str]:
    """The keys of ``metadata`` that say jaxstruct wrote the file with checksums: the
    checksums entry, :data:`MARK_KEY`, or a key one flipped bit away from either."""
    return [
        key
        for key in metadata
        if key in (CHECKSUMS_KEY, MARK_KEY) or any(_one_bit_from(key, n) for n in _MARK_NAMES)
    ]


class Checksums(NamedTuple):
    """Checked checksums: the piece size and each tensor's piece CRCs."""

    piece: int
    tensors: dict[str, tuple[int, ...]]


def _hex_crcs(text: Any, count: int) -> tuple[int, ...] | None:
    if not isinstance(text, str) or len(text) != 8 * count:
        return None
    try:
        return tuple(int(text[at : at + 8], 16) for at in range(0, len(text), 8))
    except ValueError:
        return None


_CORRUPT = ": the file is corrupt; restore it from a copy"


def decode_checksums(
    text: str,
    metadata: Mapping[str, str],
    sizes: Mapping[str, tuple[Any, Any, int, int]],
    where: str,
) -> Checksums:
    """Parse the entry and check the header's CRC against the header just read.

    ``sizes``: each tensor's ``(dtype, shape, first, end)``, offsets from the data's start.
    """
    what = f"metadata entry {CHECKSUMS_KEY}"
    try:
        document = parse_json(text, where, what)
    except SerializationError as err:
        raise SerializationError(f"{err}{_CORRUPT}") from None
    version = document.get("version") if isinstance(document, dict) else None
    if type(version) is int and version > _VERSION:
        raise SerializationError(
            f"{where}: the {what} is of version {version}, newer than this "
            "jaxstruct-safetensors reads: upgrade jaxstruct-safetensors (or, if the file is "
            "damaged, restore it from a copy)"
        )
    if version != _VERSION:
        raise SerializationError(f"{where}: the {what} is malformed{_CORRUPT}")
    piece, found, stored = document.get("piece"), document.get("tensors"), document.get("header")
    if type(piece) is not int or piece <= 0 or not isinstance(found, dict):
        raise SerializationError(f"{where}: the {what} has no valid 'piece' or 'tensors'{_CORRUPT}")
    expected = _hex_crcs(stored, 1)
    actual = header_crc(
        metadata, ((name, dtype, shape) for name, (dtype, shape, _, _) in sizes.items())
    )
    if expected is None or expected[0] != actual:
        raise SerializationError(
            f"{where}: the safetensors header does not match its checksum: the file is "
            "corrupt (a changed byte in the manifest or the tensor table); restore it from a copy"
        )
    if set(found) != set(sizes):
        raise SerializationError(
            f"{where}: the {what} does not list exactly the file's tensors{_CORRUPT}"
        )
    tensors = {}
    for name, (_, _, first, end) in sizes.items():
        crcs = _hex_crcs(found[name], math.ceil((end - first) / piece))
        if crcs is None:
            raise SerializationError(f"{where}: malformed {what} for tensor {name!r}{_CORRUPT}")
        tensors[name] = crcs
    return Checksums(piece, tensors)


def _mismatch(where: str, name: str, index: int, piece: int) -> SerializationError:
    return SerializationError(
        f"{where}: tensor {name!r} does not match its checksum (in its data's bytes from "
        f"{index * piece} on): the file is corrupt; restore it from a copy"
    )


class Checker:
    """Checks, on the CRC threads, what a load read; :meth:`finish` raises on a mismatch."""

    def __init__(self, checksums: Checksums, where: str) -> None:
        self.checksums = checksums
        self.where = where
        self.futures: list[concurrent.futures.Future[None]] = []

    def whole(self, name: str, first_piece: int, data: Any) -> None:
        """Check ``data``: the tensor's bytes from piece ``first_piece`` on."""
        # On jaxstruct-io's checksum threads, while the calling thread reads on.
        self.futures.append(submit_to_workers(self._whole, name, first_piece, data, checksums=True))

    def _whole(self, name: str, first_piece: int, data: Any) -> None:
        expected = self.checksums.tensors[name]
        for offset, crc in enumerate(piece_crcs(data, self.checksums.piece)):
            if expected[first_piece + offset] != crc:
                raise _mismatch(self.where, name, first_piece + offset, self.checksums.piece)

    def runs(
        self, fd: int, name: str, begin: int, nbytes: int, runs: list[tuple[int, memoryview]]
    ) -> None:
        """Check the pieces touched by ``runs`` (``(offset in the tensor, bytes read)``, in
        order): the bytes of those pieces that were not read are read here."""
        self.futures.append(
            submit_to_workers(self._runs, fd, name, begin, nbytes, runs, checksums=True)
        )

    def _runs(
        self, fd: int, name: str, begin: int, nbytes: int, runs: list[tuple[int, memoryview]]
    ) -> None:
        piece = self.checksums.piece
        expected = self.checksums.tensors[name]
        index, crc, at = -1, 0, 0  # the piece being summed, its CRC so far, its next byte

        def gap(upto: int) -> None:
            nonlocal crc, at
            if upto > at:
                data = os.pread(fd, upto - at, begin + at)
                if len(data) != upto - at:
                    raise SerializationError(
                        f"{self.where}: the file ended inside tensor {name!r} (truncated?)"
                    )
                crc = crc32(data, crc)
                at = upto

        def close() -> None:
            if index >= 0:
                gap(min(nbytes, (index + 1) * piece))
                if crc != expected[index]:
                    raise _mismatch(self.where, name, index, piece)

        for offset, view in runs:
            done = 0
            while done < len(view):
                here = offset + done
                if here // piece != index:
                    close()
                    index, crc, at = here // piece, 0, here // piece * piece
                gap(here)
                take = min(len(view) - done, (index + 1) * piece - here)
                crc = crc32(view[done : done + take], crc)
                done += take
                at = here + take
        close()

    def finish(self) -> None:
        """Wait for every check; raise the first mismatch found."""
        futures, self.futures = self.futures, []
        concurrent.futures.wait(futures)
        for future in futures:
            future.result()
