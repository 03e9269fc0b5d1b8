"""Reading and writing ``.npy`` headers without ``numpy.lib.format``'s pickle paths.

Array members are plain ``.npy`` files (version 1.0, or 2.0 for very long
headers), so ``numpy.load(..., allow_pickle=False)`` reads every member of a
checkpoint. The header is parsed with :func:`ast.literal_eval` on a bounded
string and then checked key by key.
"""

from __future__ import annotations

import functools
import re
import struct

import numpy as np
from jaxstruct.registry import SerializationError

__all__ = ["MAGIC", "array_bytes", "build_header", "parse_header", "prefix_length"]

MAGIC = b"\x93NUMPY"
_MAX_HEADER = 65_535


def array_bytes(arr: np.ndarray) -> tuple[memoryview, bool]:
    """Return the raw bytes of ``arr`` in on-disk order, and whether that is Fortran order.

    C- and Fortran-contiguous arrays are not copied; other layouts are copied
    once into C order.
    """
    if arr.flags.c_contiguous:
        flat, fortran = arr.reshape(-1), False
    elif arr.flags.f_contiguous:
        flat, fortran = arr.T.reshape(-1), True
    else:
        flat, fortran = np.ascontiguousarray(arr).reshape(-1), False
    if flat.dtype.itemsize == 0:
        return memoryview(b""), fortran
    # numpy's stubs do not declare __buffer__ yet.
    return memoryview(flat.view(np.uint8)), fortran  # pyright: ignore[reportArgumentType]


@functools.lru_cache(maxsize=256)  # checkpoints of many arrays repeat a few shapes
def build_header(dtype: np.dtype, shape: tuple[int, ...], fortran: bool) -> bytes:
    """Return a complete ``.npy`` header (magic, version, length, dict) for the given array."""
    text = f"{{'descr': {dtype.str!r}, 'fortran_order': {fortran!r}, 'shape': {tuple(shape)!r}, }}"
    body = text.encode("latin1")
    for version, prefix in (((1, 0), 10), ((2, 0), 12)):
        pad = -(prefix + len(body) + 1) % 64
        total = len(body) + pad + 1
        if version == (2, 0) or total <= _MAX_HEADER:
            length = struct.pack("<H" if version == (1, 0) else "<I", total)
            return MAGIC + bytes(version) + length + body + b" " * pad + b"\n"
    raise AssertionError("unreachable")  # pragma: no cover


def prefix_length(first: bytes, where: str) -> tuple[int, int]:
    """Return ``(prefix size, header size)`` from the first 12 bytes of a ``.npy`` member."""
    if len(first) < 10 or first[:6] != MAGIC:
        raise SerializationError(f"{where}: not a .npy member (bad magic bytes)")
    major = first[6]
    if major == 1:
        return 10, struct.unpack("<H", first[8:10])[0]
    if major in (2, 3) and len(first) >= 12:
        return 12, struct.unpack("<I", first[8:12])[0]
    raise SerializationError(f"{where}: unsupported .npy version {major}.{first[7]}")


_HEADER = re.compile(
    r"^\{\s*'descr'\s*:\s*'([<>|=]?[A-Za-z0-9\[\]]{1,32})'\s*,"
    r"\s*'fortran_order'\s*:\s*(True|False)\s*,"
    r"\s*'shape'\s*:\s*\(\s*((?:[0-9]{1,20}\s*,\s*){0,64}(?:[0-9]{1,20})?)\s*\)\s*,?\s*\}\s*$"
)


def parse_header(text: bytes, where: str) -> tuple[str, bool, tuple[int, ...]]:
    """Parse a ``.npy`` header dict into ``(descr, fortran_order, shape)``.

    The header is matched against the exact layout NumPy writes (keys in
    sorted order) rather than evaluated: nothing in it is ever executed or
    handed to Python's parser.

    Raises:
        SerializationError: the header is not a dict with exactly those keys and types.
    """
    if len(text) > _MAX_HEADER * 16:
        raise SerializationError(f"{where}: .npy header of {len(text)} bytes is too long")
    match = _HEADER.match(text.decode("latin1"))
    if match is None:
        raise SerializationError(
            f"{where}: malformed .npy header; expected keys descr, fortran_order and shape"
        )
    descr, fortran, dims = match.groups()
    shape = tuple(int(n) for n in dims.replace(",", " ").split())
    if len(dims.strip()) and len(shape) == 1 and not dims.strip().endswith(","):
        raise SerializationError(
            f"{where}: .npy header shape of one dimension needs a trailing comma"
        )
    return descr, fortran == "True", shape
