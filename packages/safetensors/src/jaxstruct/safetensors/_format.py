"""The ``safetensors`` format: one ``.safetensors`` file, tensors named by tree path.

Writing: every array becomes the tensor named by its tree path
(``params.layers.0.w``, :func:`jaxstruct.io.array_paths`), stored as it is when safetensors has
its dtype (bool, ints, float16/32/64, bfloat16, float8 e4m3fn and e5m2) and
otherwise in a documented portable form: complex arrays as their real view
(``F32``/``F64`` with a trailing axis of 2: real, imaginary), every other
dtype (other float8 kinds, int4, big-endian arrays) as raw bytes (``U8`` with a
trailing axis of the item size). The file's ``__metadata__`` holds
jaxstruct's manifest (``jaxstruct.manifest``) and, per array key, the tensor
name and the form it was stored in (``jaxstruct.tensors``), so ``load``
gives back the exact classes, static fields and dtypes; typed PRNG keys are
stored as their key data (``uint32``) and rebuilt from the manifest.

Writing is the safetensors library's (``safetensors.serialize_file``, from
the arrays' own buffers) unless that would need more than ``_write.COPY_BUDGET``
bytes of host copies at once; then the file is written tensor by tensor in the
same layout (``_write``). ``jaxstruct.io`` makes the file durable (fsync) and
publishes it.

Reading is this package's own, where the library falls short (``_read`` says
how, measured): the header is checked by ``_header`` (strict JSON through
:func:`jaxstruct.io.parse_json`, ``Limits`` before any allocation) before
anything else; a file with jaxstruct's metadata is a jaxstruct checkpoint,
any other safetensors file opens without a manifest (its tensors fill a
``target=`` by tree path, through ``jaxstruct.io``). Tensors are read lazily,
only those wanted, each straight into 64-byte aligned result buffers, and
each shard of a sharded target only its own bytes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
from jaxstruct.io import (
    ArraySpec,
    Format,
    Limits,
    OpenedCheckpoint,
    array_paths,
    parse_json,
)
from jaxstruct.registry import SerializationError

from ._checksums import (
    CHECKSUMS_KEY,
    MARK_KEY,
    MARK_VALUE,
    Checker,
    Checksums,
    decode_checksums,
    marks,
)
from ._header import DAMAGED, Entry, Header, dtype_of, read_header, stored_name
from ._read import read_tensor
from ._write import Tensor, write_file

__all__ = ["MANIFEST_KEY", "TENSORS_KEY", "SafetensorsFormat"]

#: ``__metadata__`` entries written by jaxstruct.
MANIFEST_KEY = "jaxstruct.manifest"
TENSORS_KEY = "jaxstruct.tensors"
_FORMS = frozenset({"complex", "bytes"})


class Stored(NamedTuple):
    """How one array key is stored: tensor name, form (``""``: as is) and memory order."""

    name: str
    form: str = ""
    fortran: bool = False


def _form(dtype: np.dtype) -> str:
    """How an array of ``dtype`` is stored: as it is (``""``), its real view, or its bytes."""
    if stored_name(dtype) is not None:
        return ""
    if dtype.kind == "c" and dtype.itemsize in (8, 16) and dtype.byteorder != ">":
        return "complex"
    return "bytes"


def storage_of(dtype: np.dtype, shape: tuple[int, ...], form: str) -> tuple[str, tuple[int, ...]]:
    """The safetensors dtype name and shape an array of ``dtype`` and ``shape`` is stored as."""
    if form == "complex":
        return ("F32" if dtype.itemsize == 8 else "F64"), (*shape, 2)
    if form == "bytes":
        return "U8", (*shape, dtype.itemsize)
    name = stored_name(dtype)
    if name is None:  # pragma: no cover - callers check the form first
        raise SerializationError(f"dtype {dtype} has no safetensors name")
    return name, shape


def _fortran(arr: Any) -> bool:
    return (
        isinstance(arr, np.ndarray)
        and arr.ndim > 1
        and arr.flags.f_contiguous
        and not arr.flags.c_contiguous
    )


def _plan(manifest: bytes, arrays: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, Stored]]:
    """The ``__metadata__`` and the storage of each array key, in file order."""
    try:
        document = json.loads(manifest)
        names = array_paths(document["manifest"])
    except (ValueError, KeyError, IndexError, TypeError) as err:  # pragma: no cover - export's own
        raise SerializationError(f"the manifest cannot be walked ({err})") from None
    stored = {}
    for key, arr in arrays.items():
        dtype = np.dtype(arr.dtype)
        # (Every array has a path; a key the walk missed keeps its own name.)
        stored[key] = Stored(names.get(key, f"~{key}"), _form(dtype), _fortran(arr))

    def alignment(key: str) -> tuple[int, str]:
        dtype = np.dtype(arrays[key].dtype)
        shape = tuple(arrays[key].shape)
        tensor_dtype, _ = storage_of(dtype, shape, stored[key].form)
        return -dtype_of(tensor_dtype).itemsize, stored[key].name

    order = sorted(stored, key=alignment)
    table = {
        k: {
            "name": s.name,
            **({"as": s.form} if s.form else {}),
            **({"order": "F"} if s.fortran else {}),
        }
        for k, s in stored.items()
    }
    metadata = {
        MANIFEST_KEY: manifest.decode("utf-8"),
        TENSORS_KEY: json.dumps(table, separators=(",", ":")),
        MARK_KEY: MARK_VALUE,  # the writer adds the checksums entry, the other mark
    }
    return metadata, {k: stored[k] for k in order}


class SafetensorsFormat(Format):
    """``.safetensors`` files: tensors by tree path, jaxstruct's manifest in the metadata.

    Chosen on export by the ``.safetensors`` suffix or ``format="safetensors"``;
    loading detects it, and also reads safetensors files other tools wrote into
    a ``target=`` (see ``docs/safetensors.md``).

    Example:
        >>> import tempfile, numpy as np
        >>> from pathlib import Path
        >>> import jaxstruct.io as jio
        >>> path = Path(tempfile.mkdtemp()) / "w.safetensors"
        >>> _ = jio.export({"w": np.arange(3)}, path)
        >>> jio.load(path)["w"]
        array([0, 1, 2])
    """

    name = "safetensors"
    suffixes = (".safetensors",)
    is_directory = False
    checks_arrays = True

    def write(
        self,
        target: Any,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        """Write the file (by the safetensors library's writer when it can, ``_write``)."""
        if compression == "deflate":
            raise SerializationError(
                'safetensors files are never compressed; leave compression="auto" or "none"'
            )
        metadata, plan = _plan(manifest, arrays)
        tensors = {}
        for key, stored in plan.items():
            arr = arrays[key]
            dtype, shape = np.dtype(arr.dtype), tuple(arr.shape)
            tensor_dtype, tensor_shape = storage_of(dtype, shape, stored.form)
            nbytes = math.prod(shape) * dtype.itemsize
            tensors[key] = Tensor(stored.name, tensor_dtype, tensor_shape, nbytes)
        write_file(target, metadata, tensors, arrays)
        step("arrays-written")  # jaxstruct.io makes the file durable, then publishes it

    def sniff(self, path: Any) -> bool:
        """A file starting with a header length that fits it and ``{``; named
        ``.safetensors``, either of the two is enough, so that a damaged file (one flipped
        bit) gets :meth:`open`'s error saying what is wrong, not "not a checkpoint"."""
        try:
            with open(path, "rb") as file:
                head = file.read(9)
                size = os.fstat(file.fileno()).st_size
        except OSError:
            return False
        if len(head) != 9:
            return False
        fits = 8 + int.from_bytes(head[:8], "little") <= size
        brace = head[8:9] == b"{"
        if str(path).lower().endswith(".safetensors"):
            return fits or brace
        return fits and brace

    def owns(self, path: Any) -> bool:
        """Whether ``path`` is a jaxstruct safetensors file (``overwrite`` replaces only those)."""
        try:
            with open(path, "rb") as file:
                header = read_header(file, Limits(), repr(str(path)))
        except (OSError, SerializationError):
            return False
        return MANIFEST_KEY in header.metadata

    def open(self, path: Any, limits: Limits) -> OpenedCheckpoint:
        """Read and check the header within ``limits``; tensors are read on demand."""
        where = repr(str(path))
        file = open(path, "rb")  # noqa: SIM115 - open until the checkpoint is closed
        try:
            header = read_header(file, limits, where)
            checksums = _file_checksums(header, where)
            stored = _stored_table(header, where) if MANIFEST_KEY in header.metadata else None
        except BaseException:
            file.close()
            raise
        if checksums is None:
            return _Opened(file, header, stored, where)
        return _CheckedOpened(file, header, stored, where, checksums)


def _file_checksums(header: Header, where: str) -> Checksums | None:
    """The file's checksums, the header's own checked; ``None`` when it has none and no
    mark says it should (a file another tool wrote, or one of jaxstruct-safetensors
    before checksums)."""
    text = header.metadata.get(CHECKSUMS_KEY)
    if text is None:
        found = marks(header.metadata)
        if found:
            raise SerializationError(
                f"{where}: jaxstruct wrote this file with checksums (its header holds "
                f"{found[0]!r}), but their entry {CHECKSUMS_KEY!r} is missing or renamed: "
                "the header is corrupt; restore the file from a copy"
            )
        return None
    start = header.data_start
    sizes = {
        name: (e.dtype, e.shape, e.begin - start, e.end - start)
        for name, e in header.tensors.items()
    }
    return decode_checksums(text, header.metadata, sizes, where)


def _stored_table(header: Header, where: str) -> dict[str, Stored]:
    """Check ``jaxstruct.tensors``: each array key's tensor, form and order."""
    try:
        table = parse_json(
            header.metadata.get(TENSORS_KEY, ""), where, f"metadata entry {TENSORS_KEY}"
        )
    except SerializationError as err:
        raise SerializationError(f"{err}{DAMAGED}") from None
    if not isinstance(table, dict):
        raise SerializationError(f"{where}: the metadata's {TENSORS_KEY} is not an object{DAMAGED}")
    out = {}
    for key, info in table.items():
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("name"), str)
            or not set(info) <= {"name", "as", "order"}
            or info.get("as", "complex") not in _FORMS
            or info.get("order", "F") != "F"
        ):
            raise SerializationError(
                f"{where}: malformed {TENSORS_KEY} entry for array {key!r}{DAMAGED}"
            )
        if info["name"] not in header.tensors:
            raise SerializationError(
                f"{where}: array {key!r} is stored as the tensor {info['name']!r}, which the "
                "file does not hold"
            )
        out[key] = Stored(info["name"], info.get("as", ""), "order" in info)
    return out


#: What protects the bytes of a file without checksums (``inspect`` reports it).
_UNCHECKED = "none: written by another tool"
_UNCHECKED_OURS = "none: written by an earlier jaxstruct-safetensors, which stored no checksums"


class _Opened(OpenedCheckpoint):
    """An open file without checksums: read as it is."""

    checksums: Checksums | None = None

    def __init__(
        self, file: Any, header: Header, stored: dict[str, Stored] | None, where: str
    ) -> None:
        self.file = file
        self.header = header
        self.stored = stored
        self.where = where
        self.manifest = None if stored is None else header.metadata[MANIFEST_KEY].encode("utf-8")
        # A file another tool wrote is names and tensors only: ``load`` may give them as a dict.
        self.loads_flat = stored is None
        self.checksum_scheme = _UNCHECKED if stored is None else _UNCHECKED_OURS

    def tensors(self) -> dict[str, ArraySpec]:
        return {
            name: ArraySpec(e.dtype, e.shape, e.end - e.begin)
            for name, e in self.header.tensors.items()
        }

    def _entry(self, key: str, spec: ArraySpec) -> tuple[Entry, bool]:
        """The tensor holding ``key``, checked against the manifest's dtype and shape."""
        if self.stored is None:
            entry = self.header.tensors[key]
            if entry.dtype != spec.dtype or entry.shape != tuple(spec.shape):  # pragma: no cover
                raise SerializationError(f"{self.where}: tensor {key!r} changed")
            return entry, False
        stored = self.stored.get(key)
        if stored is None:
            raise SerializationError(f"{self.where}: the metadata does not say where {key!r} is")
        entry = self.header.tensors[stored.name]
        dtype, shape = np.dtype(spec[0]), tuple(spec[1])
        if stored.form == "" and stored_name(dtype) is None:
            raise SerializationError(
                f"{self.where}: tensor {stored.name!r} claims to hold {dtype} as it is, which "
                "safetensors has no name for"
            )
        want_dtype, want_shape = storage_of(dtype, shape, stored.form)
        if entry.dtype != dtype_of(want_dtype):
            raise SerializationError(
                f"{self.where}: tensor {stored.name!r} is {entry.dtype}, but the manifest's "
                f"{dtype} stored as {stored.form or 'itself'} needs {want_dtype}"
            )
        if entry.shape != want_shape:
            raise SerializationError(
                f"{self.where}: tensor {stored.name!r} has shape {entry.shape}, but the "
                f"manifest says {shape} (stored as {want_shape})"
            )
        return entry, stored.fortran

    def read_arrays(
        self, table: Mapping[str, ArraySpec], wanted: Mapping[str, Any]
    ) -> dict[str, Any]:
        if self.stored is not None:
            extra = sorted(set(self.stored) - set(table))[:5]
            missing = sorted(set(table) - set(self.stored))[:5]
            if extra or missing:
                raise SerializationError(
                    f"{self.where}: the metadata's tensor table and the manifest disagree "
                    f"(unknown: {extra}, missing: {missing})"
                )
        out = {}
        fd = self.file.fileno()
        checker = None if self.checksums is None else Checker(self.checksums, self.where)
        try:
            for key, placement in wanted.items():
                spec = table[key]
                entry, fortran = self._entry(key, spec)
                dtype, shape = np.dtype(spec[0]), tuple(spec[1])
                check = None if checker is None else (checker, self._tensor_name(key))
                value = read_tensor(
                    fd, entry.begin, dtype, shape, placement, where=self.where, check=check
                )
                if fortran and placement is None:
                    value = np.asfortranarray(value)
                out[key] = value
        finally:
            if checker is not None:
                checker.finish()  # every check ends before the file may close
        return out

    def _tensor_name(self, key: str) -> str:
        return key if self.stored is None else self.stored[key].name

    def close(self) -> None:
        self.file.close()


class _CheckedOpened(_Opened):
    """An open file with checksums: every byte read is checked (``_checksums``)."""

    def __init__(
        self,
        file: Any,
        header: Header,
        stored: dict[str, Stored] | None,
        where: str,
        checksums: Checksums,
    ) -> None:
        super().__init__(file, header, stored, where)
        self.checksums = checksums
        self.arrays_checked = True  # present, the header's CRC matched: every read checks
        piece = checksums.piece
        size = f"{piece >> 20} MiB" if piece % (1 << 20) == 0 else f"{piece} bytes"
        self.checksum_scheme = f"CRC-32 per {size} piece of every tensor, and of the header"

    def verify(self, table: Mapping[str, ArraySpec]) -> list[str]:
        """Read (and so check) every array, one at a time; one message per bad array."""
        return self.verify_by_reading(table)
