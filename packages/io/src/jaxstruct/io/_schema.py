"""The manifest's schema, read: format version, dtype names, reader limits, JSON parse and checks.

(How a value becomes a manifest, dtype names and JSON text included, is ``_encode``'s.)
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from jaxstruct.registry import SerializationError

# zlib-ng's CRC-32 runs several times faster than zlib's.
from zlib_ng.zlib_ng import crc32

from . import _process

MiB = 1 << 20
GiB = 1 << 30


def clip(text: str, n: int = 60) -> str:
    """``text`` cut to ``n`` characters for a message (``...`` marks the cut)."""
    return text if len(text) <= n else text[: n - 3] + "..."


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """The ceilings a reader enforces on an untrusted checkpoint.

    Attributes:
        max_manifest_bytes: size of ``manifest.json`` (default 64 MiB).
        max_depth: nesting depth of the stored value tree (default 100,000).
        max_nodes: number of nodes in the stored value tree (default 10,000,000).
        max_array_bytes: total decoded size of all arrays (default 64 GiB).
        max_inflation_ratio: decoded size over stored size of a compressed
            member (default 1,100; DEFLATE itself cannot exceed about 1,032).
    """

    max_manifest_bytes: int = 64 * MiB
    max_depth: int = 100_000
    max_nodes: int = 10_000_000
    max_array_bytes: int = 64 * GiB
    max_inflation_ratio: int = 1_100


DEFAULT_LIMITS = Limits()
_LIMIT_NAMES = tuple(f.name for f in dataclasses.fields(Limits))


def limits_from_kwargs(function: str, kwargs: dict[str, Any]) -> Limits:
    """Build a :class:`Limits` from keyword arguments, rejecting unknown names and bad values."""
    unknown = sorted(set(kwargs) - set(_LIMIT_NAMES))
    if unknown:
        raise TypeError(
            f"{function}() got unexpected keyword argument(s) {unknown}; "
            f"the limit keywords are {list(_LIMIT_NAMES)}"
        )
    for name, value in kwargs.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SerializationError(
                f"{function}(): {name} must be a positive int, got {type(value).__name__} {value!r}"
            )
    return dataclasses.replace(DEFAULT_LIMITS, **kwargs) if kwargs else DEFAULT_LIMITS


# Only names listed here are ever looked up on the ml_dtypes module.
ML_NAMES = frozenset(
    {
        "bfloat16",
        "float4_e2m1fn",
        "float6_e2m3fn",
        "float6_e3m2fn",
        "float8_e3m4",
        "float8_e4m3",
        "float8_e4m3b11fnuz",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "int1",
        "int2",
        "int4",
        "uint1",
        "uint2",
        "uint4",
    }
)
NUMPY_STR = re.compile(
    r"^[<>|][biufc][1-9][0-9]?$"
    r"|^[<>|][SUV][0-9]{1,9}$"
    r"|^[<>|][mM]8(\[[0-9]{0,4}[a-zA-Z]{1,2}\])?$"
)


_PARSED: dict[str, np.dtype] = {}  # names already parsed, with their dtype


def parse_dtype(name: object, where: str) -> np.dtype:
    """Return the dtype a manifest names, without evaluating anything the file controls."""
    if not isinstance(name, str):
        raise SerializationError(
            f"{where}: expected a dtype name string, got {type(name).__name__}"
        )
    found = _PARSED.get(name)
    if found is not None:
        return found
    if name in ML_NAMES:
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes ships with jax
            raise SerializationError(
                f"{where}: dtype {name!r} needs the ml_dtypes package; install it (pip install "
                "ml_dtypes) to load this array"
            ) from None
        scalar = getattr(ml_dtypes, name, None)
        if scalar is None:
            raise SerializationError(
                f"{where}: the installed ml_dtypes has no dtype {name!r}; upgrade ml_dtypes"
            )
        dtype = np.dtype(scalar)
    else:
        if not NUMPY_STR.match(name):
            raise SerializationError(f"{where}: unsupported or malformed dtype name {name!r}")
        try:
            dtype = np.dtype(name)
        except (TypeError, ValueError) as err:
            raise SerializationError(f"{where}: invalid dtype name {name!r} ({err})") from None
        if dtype.hasobject or dtype.fields is not None:
            raise SerializationError(f"{where}: dtype {name!r} is not allowed")
    if len(_PARSED) < 1024:
        _PARSED[name] = dtype
    return dtype


#: The version of the checkpoint layout that this code writes (and the newest it reads).
#: Version 2 added the manifest's ``checksums`` section and its seal.
FORMAT_VERSION = 2

MARKER = "jaxstruct"
_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_MAX_NDIM = 64


#: The ``checksums`` section of a manifest whose format checks every stored byte itself
#: (``Format.checks_arrays``); otherwise it holds jaxstruct's own CRC-32s (``_checksums``).
BY_FORMAT: Mapping[str, Any] = {"by": "format"}

# A manifest ends with its seal, the last member of its JSON object:
# ``,"seal":"crc32:<8 hex digits>"}``, the CRC-32 of every byte before the comma. It is
# written and checked here, whatever the format stores the manifest in, so a changed
# byte of any manifest is found. A version-2 manifest without its seal (a flipped bit in
# the seal itself) is refused, and so is a seal on a manifest that does not check.
_SEAL = re.compile(rb',"seal":"crc32:([0-9a-f]{8})"\}\s*\Z')
_SEAL_ROOM = 48  # the seal is 31 bytes as written; room for trailing whitespace


def _unsealed(data: bytes, where: str, *, check: bool = True) -> tuple[bytes, bool]:
    """``data`` without its seal, checked (and whether it had one)."""
    found = _SEAL.search(data, max(0, len(data) - _SEAL_ROOM))
    if found is None:
        return data, False
    end = found.start()
    stored, computed = int(found.group(1), 16), crc32(memoryview(data)[:end]) if check else 0
    if check and stored != computed:
        raise SerializationError(
            f"{where}: the manifest does not match its seal (stored crc32 {stored:08x}, "
            f"computed {computed:08x}): it was changed or damaged after jaxstruct wrote it; "
            "restore the checkpoint from a copy"
        )
    return data[:end] + b"}", True


_SCAN_CHUNK = 1 << 20  # about 16 MiB of temporaries per step
_NODES_KEY = b'"nodes"'


def check_node_budget(data: bytes, where: str, max_nodes: int) -> None:
    """Refuse a manifest with more than ``max_nodes`` nodes before parsing it."""
    if data.count(b"[") <= max_nodes:  # every node is a JSON array: nothing to count
        return
    # Escaped backslashes and quotes cannot delimit strings; blank them out.
    text = data.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    buf = np.frombuffer(text, np.uint8)
    parity = 0  # inside a string?
    depth = 0
    nodes_depth = -1  # depth inside the "nodes" array, once found
    commas = 0
    for start in range(0, len(buf), _SCAN_CHUNK):
        chunk = buf[start : start + _SCAN_CHUNK]
        quotes = chunk == ord('"')
        inside = ((np.cumsum(quotes, dtype=np.int32) + parity) & 1).astype(bool) | quotes
        parity = (parity + int(quotes.sum())) & 1
        opens = ((chunk == ord("[")) | (chunk == ord("{"))) & ~inside
        closes = ((chunk == ord("]")) | (chunk == ord("}"))) & ~inside
        level = depth + np.cumsum(opens.astype(np.int32) - closes.astype(np.int32))
        begin = 0
        if nodes_depth < 0:
            # The "nodes" key at depth 2 (inside the top object's "manifest" object).
            for found in np.flatnonzero(opens & (level == 3) & (chunk == ord("["))):
                back = text[max(0, start + found - 24) : start + found].rstrip(b" \t\r\n:")
                if back.endswith(_NODES_KEY):
                    nodes_depth, begin = 3, int(found)
                    break
        if nodes_depth > 0:
            at = (chunk[begin:] == ord(",")) & ~inside[begin:] & (level[begin:] == nodes_depth)
            commas += int(np.count_nonzero(at))
            if commas + 1 > max_nodes:
                raise SerializationError(
                    f"{where}: the manifest holds more than max_nodes={max_nodes} nodes; if you "
                    "trust this file, pass a larger max_nodes="
                )
        depth = int(level[-1]) if len(level) else depth


#: Documents of at least this many characters are parsed with the cyclic collector paused.
_PAUSE_FROM = 1 << 16


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SerializationError(f"duplicate JSON key {key!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise SerializationError(f"JSON literal {name} is not allowed")


def parse_json(data: bytes | str, where: str, what: str = "JSON") -> Any:
    """Parse JSON strictly, as jaxstruct reads every JSON document of a checkpoint.

    Stricter than :func:`json.loads`: bytes must be UTF-8, an object must not
    repeat a key (``json.loads`` keeps the last one silently) and the
    ``NaN``/``Infinity`` literals are refused. Plugins reading JSON from a file
    use it too, so a malformed document is the same error in every format.

    Args:
        data: the JSON text, as UTF-8 bytes or a string.
        where: the file or entry it comes from, at the start of every message.
        what: what the document is, for the messages (``"manifest"``, ...).

    Returns:
        The parsed value.

    Raises:
        SerializationError: the text is not UTF-8, not JSON, nested deeper than
            Python's recursion limit, repeats a key or holds ``NaN``/``Infinity``.

    Example:
        >>> parse_json(b'{"a": [1, 2]}', "x.json")
        {'a': [1, 2]}
        >>> try:
        ...     parse_json(b'{"a": 1, "a": 2}', "x.json")
        ... except SerializationError as err:
        ...     print(err)
        x.json: malformed JSON: duplicate JSON key 'a'
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise SerializationError(f"{where}: {what} is not UTF-8 text") from None
    try:
        if len(text) < _PAUSE_FROM:  # too few objects for the collector to run often
            return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
        # A few objects per node, none cyclic: the collector's passes over the
        # 100,000 nodes of as many arrays would cost more than building them.
        with _process.paused():
            return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except SerializationError as err:
        raise SerializationError(f"{where}: malformed {what}: {err}") from None
    except RecursionError:
        raise SerializationError(f"{where}: {what} JSON is nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, and ints longer than Python's digit limit
        raise SerializationError(f"{where}: {what} is not valid JSON ({err})") from None


def parse_manifest(data: bytes, where: str, *, check_seal: bool = True) -> dict[str, Any]:
    """Parse manifest bytes into the top-level dict, checking seal, marker and version.

    The seal is checked before anything is parsed (unless ``check_seal`` is false: to
    recognise a damaged checkpoint of ours, which ``overwrite=True`` may replace); the
    returned dict has no ``seal``. A version-1 manifest (written before seals and
    checksums) has neither.
    """
    body, sealed = _unsealed(data, where, check=check_seal)
    value = parse_json(body, where, "manifest")
    if not isinstance(value, dict) or value.get("format") != MARKER:
        raise SerializationError(f"{where}: not a jaxstruct manifest (no 'format': 'jaxstruct')")
    version = check_version(value.get("version"), where)
    if version >= 2 and not sealed and check_seal:
        raise SerializationError(
            f'{where}: the manifest has lost its seal (its last member, "seal", which '
            f"every manifest of format version {version} ends with): the file was damaged "
            "or edited after jaxstruct wrote it; restore the checkpoint from a copy"
        )
    expected = {"format", "version", "container", "arrays", "manifest"}
    if version >= 2:
        expected.add("checksums")
    if set(value) != expected:
        raise SerializationError(
            f"{where}: manifest keys {sorted(value)} differ from the expected {sorted(expected)}"
        )
    if version >= 2:
        _check_checksums_section(value["checksums"], where)
    return value


def _check_checksums_section(section: object, where: str) -> None:
    """Refuse a ``checksums`` section that is neither :data:`BY_FORMAT` nor jaxstruct's."""
    if isinstance(section, dict) and section == BY_FORMAT:
        return
    if (
        isinstance(section, dict)
        and set(section) == {"by", "piece", "crc32"}
        and section["by"] == "jaxstruct"
        and type(section["piece"]) is int
        and section["piece"] in _PIECE_SIZES
        and isinstance(section["crc32"], dict)
        and all(type(v) is str for v in section["crc32"].values())
    ):
        return
    raise SerializationError(
        f"{where}: the manifest's 'checksums' section is malformed; restore the checkpoint "
        "from a copy"
    )


#: The piece sizes a ``checksums`` section may name (4 KiB to 1 GiB, powers of two).
_PIECE_SIZES = frozenset(1 << n for n in range(12, 31))


def check_version(version: object, where: str) -> int:
    """``version``, or raise unless it is a format version this reader understands."""
    if type(version) is not int:
        raise SerializationError(f"{where}: format version must be an int, got {version!r}")
    if version > FORMAT_VERSION:
        raise SerializationError(
            f"{where}: written in format version {version}, newer than the {FORMAT_VERSION} "
            "this jaxstruct-io reads; upgrade jaxstruct-io"
        )
    if version < 1:
        raise SerializationError(f"{where}: unknown format version {version}")
    return version


def check_arrays_table(
    table: object, where: str, limits: Limits
) -> dict[str, tuple[np.dtype, tuple[int, ...], int]]:
    """Check the arrays table; return ``key -> (dtype, shape, nbytes)``; enforce the byte limit."""
    if not isinstance(table, dict):
        raise SerializationError(f"{where}: the arrays table must be an object")
    out: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}
    total = 0
    for key, entry in table.items():
        if not _KEY.match(key):
            raise SerializationError(f"{where}: invalid array key {key[:40]!r}")
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape"}:
            raise SerializationError(
                f"{where}: array {key!r} must have exactly 'dtype' and 'shape'"
            )
        dtype = parse_dtype(entry["dtype"], f"{where}: array {key!r}")
        shape = entry["shape"]
        if (
            not isinstance(shape, list)
            or len(shape) > _MAX_NDIM
            or not all(type(n) is int and n >= 0 for n in shape)
        ):
            raise SerializationError(
                f"{where}: array {key!r} has an invalid shape {str(shape)[:60]}"
            )
        nbytes = math.prod(shape) * dtype.itemsize
        total += nbytes
        if total > limits.max_array_bytes:
            raise SerializationError(
                f"{where}: arrays total more than max_array_bytes={limits.max_array_bytes} bytes; "
                "if you trust this file, pass a larger max_array_bytes="
            )
        out[key] = (dtype, tuple(shape), nbytes)
    return out
