"""CRC-32: the fastest implementation at hand, and the CRC of a concatenation from its parts."""

from __future__ import annotations

import concurrent.futures

from ._pools import crc_pool

try:  # zlib-ng computes CRC-32 several times faster than zlib (23 against 3-4 GB/s here)
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - a platform without zlib-ng wheels
    from zlib import crc32

__all__ = ["CrcParts", "crc32", "crc32_combine"]

# CRC-32 of a concatenation from the CRCs of its parts (zlib's crc32_combine,
# which Python's zlib does not expose): multiply by x^(8n) modulo the polynomial.
_POLY = 0xEDB88320


def _multmodp(a: int, b: int) -> int:
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return p


def _x2n_table() -> list[int]:
    table = []
    p = 1 << 30  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return table


_X2N = _x2n_table()


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """Return the CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)``."""
    if len2 == 0:
        return crc1
    p = 1 << 31  # x^0
    k = 3
    n = len2
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


class CrcParts:
    """The CRC-32 of consecutive pieces, computed apart on the CRC threads, combined in order."""

    def __init__(self, start: int) -> None:
        self.start = start  # the CRC of what was read before
        self.parts: list[tuple[concurrent.futures.Future[int], int]] = []

    def add(self, piece: memoryview) -> None:
        self.parts.append((crc_pool().submit(crc32, piece), piece.nbytes))

    def result(self) -> int:
        crc = self.start
        for future, size in self.parts:
            crc = crc32_combine(crc, future.result(), size)
        return crc
