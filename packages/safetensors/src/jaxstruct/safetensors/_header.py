"""The safetensors header: read and checked here before anything else touches the file.

A ``.safetensors`` file is an 8-byte little-endian header length ``n``, ``n``
bytes of UTF-8 JSON (padded with spaces), then the tensors' bytes::

    {"__metadata__": {"k": "v", ...},
     "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}

Offsets count from the end of the header. :func:`read_header` checks the
length against ``max_manifest_bytes`` before reading it, parses the JSON
strictly with :func:`jaxstruct.io.parse_json` (UTF-8, no duplicate keys, no
NaN: the safetensors library's own parser keeps the last of two equal keys),
metadata strings only, and
checks every entry (a known dtype, a shape of non-negative ints, offsets
inside the file that agree with dtype and shape and never overlap) and the
total size against ``max_array_bytes``, all before any tensor is allocated.
Every failure is a :class:`~jaxstruct.registry.SerializationError`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from jaxstruct.io import Limits, parse_json
from jaxstruct.registry import SerializationError

__all__ = [
    "DAMAGED",
    "DTYPES",
    "Entry",
    "Header",
    "dtype_of",
    "encode_header",
    "numpy_name",
    "read_header",
    "stored_name",
]

_LENGTH_BYTES = 8
_MAX_NDIM = 64
METADATA = "__metadata__"

# safetensors dtype names -> NumPy (or ml_dtypes) dtype names.
_NAMES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "F16": "float16",
    "BF16": "bfloat16",
    "U32": "uint32",
    "I32": "int32",
    "F32": "float32",
    "U64": "uint64",
    "I64": "int64",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}


# The safetensors dtype names whose NumPy dtype comes from ml_dtypes (not NumPy itself).
_FROM_ML_DTYPES = frozenset({"BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0"})


def _dtypes() -> dict[str, np.dtype]:
    import ml_dtypes

    out = {}
    for name, numpy_name in _NAMES.items():
        if name in _FROM_ML_DTYPES:
            found = getattr(ml_dtypes, numpy_name, None)
            if found is None:  # an older ml_dtypes: that dtype is not read
                continue
            out[name] = np.dtype(found).newbyteorder("<")
        else:
            out[name] = np.dtype(numpy_name).newbyteorder("<")
    return out


#: safetensors dtype name -> little-endian NumPy dtype (those this ml_dtypes has).
DTYPES = _dtypes()
_NAME_OF = {dtype: name for name, dtype in DTYPES.items()}


def stored_name(dtype: np.dtype) -> str | None:
    """The safetensors name of ``dtype`` stored as it is, or ``None`` if it has none.

    Complex dtypes return ``None`` here: jaxstruct writes them as their real
    view (``C64`` is missing from older safetensors releases and readers).
    """
    if dtype.kind == "c":
        return None
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False):
        return None
    return _NAME_OF.get(dtype.newbyteorder("<"))


def numpy_name(name: str) -> str:
    """The NumPy name of a safetensors dtype name (``"BF16"`` -> ``"bfloat16"``)."""
    return _NAMES[name]


def dtype_of(name: str) -> np.dtype:
    """The NumPy dtype of a safetensors dtype name (checked by :func:`read_header`)."""
    return DTYPES[name]


class Entry(NamedTuple):
    """One tensor of the file: dtype, shape, and its absolute byte range."""

    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


class Header(NamedTuple):
    """A checked header: the metadata strings and the tensors by name."""

    metadata: dict[str, str]
    tensors: dict[str, Entry]
    data_start: int


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: What to do about a header that cannot be a safetensors file's.
DAMAGED = "; the file is damaged (or not a safetensors file): restore it from a copy"


def _entry(name: str, raw: Any, data_bytes: int, start: int, where: str) -> Entry:
    what = f"{where}: the header's tensor {name!r}"
    if not isinstance(raw, dict) or not {"dtype", "shape", "data_offsets"} <= set(raw):
        raise SerializationError(f"{what} must have 'dtype', 'shape' and 'data_offsets'{DAMAGED}")
    dtype_name, shape, offsets = raw["dtype"], raw["shape"], raw["data_offsets"]
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise SerializationError(
            f"{what} has dtype {dtype_name!r}, which jaxstruct does not read (it reads "
            f"{sorted(DTYPES)}); if the file is damaged, restore it from a copy"
        )
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(_is_int(n) and n >= 0 for n in shape)
    ):
        raise SerializationError(f"{what} has a malformed shape {str(shape)[:80]}{DAMAGED}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(n) for n in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise SerializationError(
            f"{what} has data_offsets {str(offsets)[:80]} outside the file's "
            f"{data_bytes} data bytes{DAMAGED}"
        )
    dtype = DTYPES[dtype_name]
    if math.prod(shape) * dtype.itemsize != offsets[1] - offsets[0]:
        raise SerializationError(
            f"{what}: {dtype_name} {shape} needs {math.prod(shape) * dtype.itemsize} bytes, "
            f"but its data_offsets span {offsets[1] - offsets[0]}{DAMAGED}"
        )
    return Entry(dtype, tuple(shape), start + offsets[0], start + offsets[1])


def read_header(file: Any, limits: Limits, where: str) -> Header:
    """Read and check the header of the open binary ``file`` within ``limits``."""
    size = os.fstat(file.fileno()).st_size
    head = file.read(_LENGTH_BYTES)
    if len(head) != _LENGTH_BYTES:
        raise SerializationError(f"{where}: too short for a safetensors file ({size} bytes)")
    length = int.from_bytes(head, "little")
    if length < 2 or _LENGTH_BYTES + length > size:
        raise SerializationError(
            f"{where}: the header length {length} does not fit the file's {size} bytes: "
            "the file is truncated or damaged (or not a safetensors file); restore it from a copy"
        )
    if length > limits.max_manifest_bytes:
        raise SerializationError(
            f"{where}: the safetensors header is {length} bytes, more than max_manifest_bytes="
            f"{limits.max_manifest_bytes}; if you trust this file, pass a larger "
            "max_manifest_bytes="
        )
    text = file.read(length)
    if len(text) != length:
        raise SerializationError(f"{where}: the file changed while its header was read")
    try:
        document = parse_json(text, where, "safetensors header")
    except SerializationError as err:
        raise SerializationError(f"{err}{DAMAGED}") from None
    if not isinstance(document, dict):
        raise SerializationError(f"{where}: the safetensors header is not a JSON object{DAMAGED}")
    metadata = document.pop(METADATA, {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SerializationError(
            f"{where}: the header's __metadata__ must map strings to strings{DAMAGED}"
        )
    if len(document) > limits.max_nodes:
        raise SerializationError(
            f"{where}: the file holds {len(document)} tensors, more than max_nodes="
            f"{limits.max_nodes}; if you trust this file, pass a larger max_nodes="
        )
    start = _LENGTH_BYTES + length
    data_bytes = size - start
    tensors = {name: _entry(name, raw, data_bytes, start, where) for name, raw in document.items()}
    total = sum(e.end - e.begin for e in tensors.values())
    if total > limits.max_array_bytes:
        raise SerializationError(
            f"{where}: the tensors hold {total} bytes, more than max_array_bytes="
            f"{limits.max_array_bytes}; if you trust this file, pass a larger max_array_bytes="
        )
    previous = start
    for entry in sorted(tensors.values(), key=lambda e: (e.begin, e.end)):
        if entry.begin < previous:
            raise SerializationError(f"{where}: two tensors' data_offsets overlap{DAMAGED}")
        previous = entry.end
    return Header(metadata, tensors, start)


def encode_header(
    metadata: Mapping[str, str], entries: Mapping[str, tuple[str, Any, int]]
) -> bytes:
    """The length-prefixed header for ``name -> (dtype name, shape, nbytes)``, in that order.

    Padded with spaces to a multiple of 8 bytes, so the data starts aligned.
    """
    document: dict[str, Any] = {METADATA: dict(metadata)}
    offset = 0
    for name, (dtype_name, shape, nbytes) in entries.items():
        document[name] = {
            "dtype": dtype_name,
            "shape": [int(n) for n in shape],
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % _LENGTH_BYTES)
    return len(text).to_bytes(_LENGTH_BYTES, "little") + text
