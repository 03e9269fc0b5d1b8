"""An uncompressed ``.tar`` checkpoint format, provided as a ``jaxstruct.io`` plugin.

The archive holds ``manifest.json`` first, then one member per array, named
by its tree path (``params.layers.0.w.bin``, from
:func:`jaxstruct.io.array_paths`) and holding its raw bytes (dtype and shape
are in the manifest). Every member carries its CRC-32 in a PAX header record (``JAXSTRUCT.crc32``),
checked on every read and by ``jaxstruct inspect --verify`` (the manifest's when
the archive is opened), and each array member its memory order
(``JAXSTRUCT.order``, ``C`` or ``F``).
Reading never extracts anything: it walks the headers, refuses anything that is
not a regular member with an expected name, and checks every size against the
manifest and the caller's limits before allocating.
"""

from __future__ import annotations

import os
import tarfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Literal, NamedTuple

import numpy as np
from jaxstruct.io import (
    PLUGIN_API_VERSION,
    ArraySpec,
    Format,
    Limits,
    OpenedCheckpoint,
    array_paths,
    empty_array,
    hookimpl,
    host_pieces,
    place,
    walk,
)
from jaxstruct.registry import SerializationError

__all__ = ["JAXSTRUCT_IO_PLUGIN_API", "TarFormat", "jaxstruct_register_formats"]

#: The jaxstruct.io plugin interface this plugin is written for.
JAXSTRUCT_IO_PLUGIN_API = 1
assert PLUGIN_API_VERSION >= JAXSTRUCT_IO_PLUGIN_API, "jaxstruct-io is too old for this plugin"

MANIFEST = "manifest.json"
_BLOCK = tarfile.BLOCKSIZE
_SUFFIX = ".bin"
_CRC = "JAXSTRUCT.crc32"
_ORDER = "JAXSTRUCT.order"
_CHUNK = 1 << 20  # bytes checked at a time by verify()

Order = Literal["C", "F"]


def _header(name: str, size: int, records: Mapping[str, str] | None = None) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0  # fixed, so that the same value always gives the same bytes
    if records:
        info.pax_headers = dict(records)
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _order(arr: np.ndarray) -> Order:
    """``"F"`` for an array laid out in Fortran order only, else ``"C"``."""
    return "F" if arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"


def _raw_bytes(arr: np.ndarray, order: Order) -> memoryview:
    # A uint8 view of the memory works for every dtype (bfloat16, int4, strings,
    # ...), with no copy unless the array is not contiguous.
    flat = np.asarray(arr, order=order).reshape(-1, order=order)
    return memoryview(flat.view(np.uint8))  # pyright: ignore[reportArgumentType]  # numpy stubs lack __buffer__


def _blocks(arr: Any) -> Iterator[memoryview]:
    """The bytes of ``arr`` in C order, one shard or leading-axis row at a time.

    A sharded ``jax.Array`` is never assembled in one host buffer.
    """
    if isinstance(arr, np.ndarray):
        yield _raw_bytes(arr, _order(arr))
        return
    pieces = host_pieces(arr)
    if arr.ndim == 0 or all(
        all(
            s.start in (None, 0) and s.stop in (None, n)
            for s, n in zip(idx[1:], arr.shape[1:], strict=False)
        )
        for idx, _ in pieces
    ):
        # Blocks split the leading axis only (or nothing): each is contiguous in the file.
        def start(item: tuple[tuple[slice, ...], np.ndarray]) -> int:
            return (item[0][0].start or 0) if item[0] else 0

        for _, piece in sorted(pieces, key=start):
            yield _raw_bytes(piece, "C")
        return
    # Blocks split inner axes: one leading-axis row at a time.
    for row in range(arr.shape[0]):
        out = np.empty(arr.shape[1:], dtype=arr.dtype)
        for idx, piece in pieces:
            lead = idx[0] if idx else slice(None)
            lo = lead.start or 0
            hi = arr.shape[0] if lead.stop is None else lead.stop
            if lo <= row < hi:
                out[idx[1:]] = piece[row - lo]
        yield _raw_bytes(out, "C")


def _write_array(handle: BinaryIO, name: str, arr: Any) -> None:
    """Write the member ``name`` holding ``arr``, its CRC-32 and order in its PAX header."""
    order: Order = _order(arr) if isinstance(arr, np.ndarray) else "C"
    crc = 0
    nbytes = 0
    for block in _blocks(arr):  # first pass: the checksum goes in the header
        crc = zlib.crc32(block, crc)
        nbytes += block.nbytes
    handle.write(_header(name, nbytes, {_CRC: f"{crc:08x}", _ORDER: order}))
    for block in _blocks(arr):
        handle.write(block)
    handle.write(b"\0" * (-nbytes % _BLOCK))


class TarFormat(Format):
    """One uncompressed tar archive: ``manifest.json``, then ``<tree path>.bin`` per array."""

    name = "tar"
    suffixes = (".tar",)
    is_directory = False
    # Every member carries its CRC-32 and every read checks it (a member without one is
    # refused), so jaxstruct need not keep checksums of its own for this format.
    checks_arrays = True

    def write(
        self,
        target: Path,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        """Create the archive at ``target`` (jaxstruct fsyncs and publishes it)."""
        if compression == "deflate":
            raise SerializationError(
                f"{str(target)!r}: the tar format stores arrays uncompressed; use "
                "compression='auto' or 'none', or export to a .zip path to compress"
            )
        paths = array_paths(manifest)
        with open(target, "xb") as handle:
            handle.write(_header(MANIFEST, len(manifest), {_CRC: f"{zlib.crc32(manifest):08x}"}))
            handle.write(manifest)
            handle.write(b"\0" * (-len(manifest) % _BLOCK))
            step(MANIFEST)
            for key, value in arrays.items():
                name = paths[key] + _SUFFIX
                _write_array(handle, name, value)
                step(name)
            handle.write(b"\0" * (2 * _BLOCK))  # end of archive

    def sniff(self, path: Path) -> bool:
        """Whether ``path`` is a file whose first tar header names ``manifest.json``."""
        if not path.is_file():
            return False
        with open(path, "rb") as handle:
            try:
                first = tarfile.TarInfo.frombuf(handle.read(_BLOCK), "utf-8", "surrogateescape")
            except tarfile.TarError:
                return False
            if first.size > _CHUNK:  # our first header is small: never read a huge one
                return False
            handle.seek(0)
            try:  # reads the first member's header (and its PAX records) only
                with tarfile.open(fileobj=handle, mode="r:") as archive:
                    info = archive.next()
            except (tarfile.TarError, ValueError):
                return False
        return info is not None and info.name == MANIFEST

    def open(self, path: Path, limits: Limits) -> OpenedCheckpoint:
        """Index the members of ``path`` and read its manifest, within ``limits``."""
        where = repr(str(path))
        handle = open(path, "rb")  # noqa: SIM115 - owned by the returned checkpoint
        try:
            members = _index(handle, os.fstat(handle.fileno()).st_size, limits, where)
            manifest_member = members.pop(MANIFEST)
            if manifest_member.size > limits.max_manifest_bytes:
                raise SerializationError(
                    f"{where}: manifest.json is {manifest_member.size} bytes, more than "
                    f"max_manifest_bytes={limits.max_manifest_bytes}; if you trust this file, "
                    "pass a larger max_manifest_bytes="
                )
            handle.seek(manifest_member.offset)
            manifest = handle.read(manifest_member.size)
            if manifest_member.crc is not None and zlib.crc32(manifest) != manifest_member.crc:
                raise SerializationError(
                    f"{where}: manifest.json does not match its checksum: the file is "
                    "corrupt; restore it from a good copy"
                )
        except BaseException:
            handle.close()
            raise
        return _TarCheckpoint(handle, members, manifest, where)


class _Member(NamedTuple):
    offset: int
    size: int
    crc: int | None
    order: str


def _index(handle: BinaryIO, file_size: int, limits: Limits, where: str) -> dict[str, _Member]:
    """Return ``name -> member`` for every member, refusing anything unusual."""
    members: dict[str, _Member] = {}
    try:
        archive = tarfile.open(fileobj=handle, mode="r:")  # noqa: SIM115 - the caller owns handle
        for info in archive:
            if len(members) > limits.max_nodes:
                raise SerializationError(
                    f"{where}: more than max_nodes={limits.max_nodes} members; if you trust "
                    "this file, pass a larger max_nodes="
                )
            if not info.isreg():
                raise SerializationError(
                    f"{where}: member {info.name!r} is not a regular file (links, devices and "
                    "directories are refused)"
                )
            if info.name in members:
                raise SerializationError(f"{where}: member {info.name!r} appears twice")
            if info.offset_data + info.size > file_size:
                raise SerializationError(f"{where}: member {info.name!r} runs past the end")
            crc_text = info.pax_headers.get(_CRC)
            try:
                crc = int(crc_text, 16) if crc_text is not None else None
            except ValueError:
                raise SerializationError(
                    f"{where}: member {info.name!r} has a malformed checksum {str(crc_text)[:20]!r}"
                ) from None
            order = info.pax_headers.get(_ORDER, "C")
            members[info.name] = _Member(info.offset_data, info.size, crc, order)
            # Keep no TarInfo objects around (TarFile.members is the list getmembers()
            # returns): memory stays bounded by the dict above, whatever the file holds.
            archive.members.clear()  # pyright: ignore[reportAttributeAccessIssue]
    except (tarfile.TarError, ValueError) as err:
        raise SerializationError(f"{where}: not a readable tar archive ({err})") from None
    if MANIFEST not in members:
        raise SerializationError(f"{where}: the archive has no manifest.json")
    return members


class _TarCheckpoint(OpenedCheckpoint):
    def __init__(
        self, handle: BinaryIO, members: dict[str, _Member], manifest: bytes, where: str
    ) -> None:
        self.handle = handle
        self.members = members
        self.manifest = manifest
        self.stored_manifest = manifest  # every archive of this format holds one
        self.where = where
        self.checksum_scheme = "CRC-32 of every member, the manifest's included"
        self.arrays_checked = True  # no member is read without its CRC-32 (see _names)

    def close(self) -> None:
        self.handle.close()

    def _names(self, table: Mapping[str, ArraySpec]) -> dict[str, str]:
        """``member name -> key`` for every array, checked against the archive."""
        try:
            paths = array_paths(self.stored_manifest)
            names = {paths.get(key, key) + _SUFFIX: key for key in table}
            if set(self.members) != set(names):
                older = _names_before_0_2(self.stored_manifest)
                if set(self.members) == {older.get(key, key) + _SUFFIX for key in table}:
                    names = {older.get(key, key) + _SUFFIX: key for key in table}
        except ValueError as err:
            raise SerializationError(f"{self.where}: {err}") from None
        if set(self.members) != set(names):
            extra = sorted(set(self.members) - set(names))[:5]
            missing = sorted(set(names) - set(self.members))[:5]
            raise SerializationError(
                f"{self.where}: the archive must hold exactly the arrays the manifest names "
                f"(unexpected members: {extra}, missing members: {missing})"
            )
        for name, key in names.items():
            member = self.members[name]
            if member.size != table[key].nbytes:
                raise SerializationError(
                    f"{self.where}: member {name!r} holds {member.size} bytes, but array "
                    f"{key!r} needs {table[key].nbytes}"
                )
            if member.crc is None or member.order not in ("C", "F"):
                raise SerializationError(
                    f"{self.where}: member {name!r} has no checksum or order record; it was "
                    "not written by this format"
                )
        return names

    def read_arrays(
        self, table: Mapping[str, ArraySpec], wanted: Mapping[str, Any]
    ) -> dict[str, Any]:
        names = self._names(table)  # every size is checked before any array is allocated
        out: dict[str, Any] = {}
        for name, key in names.items():
            if key not in wanted:
                continue  # partial restore: never read
            member = self.members[name]
            order: Order = "F" if member.order == "F" else "C"
            arr = empty_array(table[key], order)  # 64-byte aligned, as the contract asks
            view = memoryview(arr.reshape(-1, order=order).view(np.uint8))  # pyright: ignore[reportArgumentType]  # numpy stubs lack __buffer__
            self.handle.seek(member.offset)
            if member.size and self.handle.readinto(view) != member.size:  # type: ignore[attr-defined]
                raise SerializationError(f"{self.where}: member {name!r} is truncated")
            if zlib.crc32(view) != member.crc:
                raise SerializationError(
                    f"{self.where}: member {name!r} does not match its checksum (the file is "
                    "damaged)"
                )
            out[key] = place(arr, wanted[key])
        return out

    def verify(self, table: Mapping[str, ArraySpec]) -> list[str]:
        """Check every array member against its checksum, a small buffer at a time."""
        names = self._names(table)
        problems = []
        buffer = bytearray(_CHUNK)
        for name in names:
            member = self.members[name]
            self.handle.seek(member.offset)
            crc, left = 0, member.size
            while left:
                got = self.handle.readinto(memoryview(buffer)[: min(left, _CHUNK)])  # type: ignore[attr-defined]
                if not got:
                    break
                crc = zlib.crc32(memoryview(buffer)[:got], crc)
                left -= got
            if left:
                problems.append(f"{self.where}: member {name!r} is truncated")
            elif crc != member.crc:
                problems.append(f"{self.where}: member {name!r} does not match its checksum")
        return problems


def _names_before_0_2(manifest: bytes) -> dict[str, str]:
    """The member names (without ``.bin``) archives written with jaxstruct-io 0.1 have:
    its tree paths dropped leading empty steps and called an array at the root ``root``.
    (Every step is kept since; an empty one is ``%``.) Archives of trees without empty
    dict keys or a root array have the same names either way."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for entry in walk(manifest):
        if entry.tag not in ("array", "jaxarray", "prngkey") or len(entry.node) < 2:
            continue
        steps = entry.path.split(".") if entry.path else []
        while steps and steps[0] == "%":
            steps.pop(0)
        path = ".".join("" if step == "%" else step for step in steps) or "root"
        if path in taken:
            path = f"{path}~{entry.node[1]}"
        taken.add(path)
        out[str(entry.node[1])] = path
    return out


@hookimpl
def jaxstruct_register_formats() -> Sequence[Format]:
    """Provide the ``tar`` format (chosen for export paths ending in ``.tar``)."""
    return [TarFormat()]
