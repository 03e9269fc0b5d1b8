"""An uncompressed ``.tar`` checkpoint format, provided as a ``jaxstruct.io`` plugin.

The archive holds ``manifest.json`` first, then one member per array: its raw
bytes, as ``<key>.bin`` in C order or ``<key>.F.bin`` in Fortran order (dtype
and shape are in the manifest). Reading
never extracts anything: it walks the headers, refuses anything that is not a
regular member with an expected name, and checks every size against the
manifest and the caller's limits before allocating.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
from jaxstruct.io import (
    ArraySpec,
    Format,
    Limits,
    OpenedCheckpoint,
    empty_array,
    hookimpl,
    host_pieces,
    place,
)
from jaxstruct.registry import SerializationError

__all__ = ["TarFormat", "jaxstruct_register_formats"]

MANIFEST = "manifest.json"
_BLOCK = tarfile.BLOCKSIZE
_SUFFIX = ".bin"


def _write_member(handle: BinaryIO, name: str, data: memoryview) -> None:
    info = tarfile.TarInfo(name)
    info.size = data.nbytes
    info.mode = 0o644
    info.mtime = 0  # fixed, so that the same value always gives the same bytes
    handle.write(info.tobuf(format=tarfile.PAX_FORMAT))
    handle.write(data)
    handle.write(b"\0" * (-data.nbytes % _BLOCK))


Order = Literal["C", "F"]


def _order(arr: np.ndarray) -> Order:
    """``"F"`` for an array laid out in Fortran order only, else ``"C"``."""
    return "F" if arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"


def _raw_bytes(arr: np.ndarray, order: Order) -> memoryview:
    # A uint8 view of the memory works for every dtype (bfloat16, int4, strings,
    # ...), with no copy unless the array is not contiguous.
    flat = np.asarray(arr, order=order).reshape(-1, order=order)
    return memoryview(flat.view(np.uint8))  # pyright: ignore[reportArgumentType]  # numpy stubs lack __buffer__


def _write_sharded(handle: BinaryIO, name: str, arr: Any) -> None:
    """Write the member ``name`` holding ``arr`` in C order, one leading-axis block at a time."""
    pieces = host_pieces(arr)
    nbytes = int(np.prod(arr.shape, dtype=np.int64)) * np.dtype(arr.dtype).itemsize
    info = tarfile.TarInfo(name)
    info.size = nbytes
    info.mode = 0o644
    info.mtime = 0
    handle.write(info.tobuf(format=tarfile.PAX_FORMAT))
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
            handle.write(_raw_bytes(piece, "C"))
    else:
        # Blocks split inner axes: write one leading-axis row at a time.
        for row in range(arr.shape[0]):
            out = np.empty(arr.shape[1:], dtype=arr.dtype)
            for idx, piece in pieces:
                lead = idx[0] if idx else slice(None)
                lo = lead.start or 0
                hi = arr.shape[0] if lead.stop is None else lead.stop
                if lo <= row < hi:
                    out[idx[1:]] = piece[row - lo]
            handle.write(_raw_bytes(out, "C"))
    handle.write(b"\0" * (-nbytes % _BLOCK))


def _member_name(key: str, order: Order) -> str:
    return key + (".F" if order == "F" else "") + _SUFFIX


class TarFormat(Format):
    """One uncompressed tar archive: ``manifest.json``, then ``<key>.bin`` per array."""

    name = "tar"
    suffixes = (".tar",)
    is_directory = False

    def write(
        self,
        target: Path,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        """Create the archive at ``target`` and fsync it."""
        if compression == "deflate":
            raise SerializationError(
                f"{str(target)!r}: the tar format stores arrays uncompressed; use "
                "compression='auto' or 'none', or export to a .zip path to compress"
            )
        with open(target, "xb") as handle:
            _write_member(handle, MANIFEST, memoryview(manifest))
            step(MANIFEST)
            for key, value in arrays.items():
                if isinstance(value, np.ndarray):
                    order = _order(value)
                    name = _member_name(key, order)
                    _write_member(handle, name, _raw_bytes(value, order))
                else:
                    # A jax.Array, possibly sharded: write it block by block in C order
                    # without ever assembling it in one host buffer.
                    name = _member_name(key, "C")
                    _write_sharded(handle, name, value)
                step(name)
            handle.write(b"\0" * (2 * _BLOCK))  # end of archive
            handle.flush()
            os.fsync(handle.fileno())

    def sniff(self, path: Path) -> bool:
        """Whether ``path`` is a file whose first tar header names ``manifest.json``."""
        if not path.is_file():
            return False
        with open(path, "rb") as handle:
            block = handle.read(_BLOCK)
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.TarError:
            return False
        return info.name == MANIFEST

    def open(self, path: Path, limits: Limits) -> OpenedCheckpoint:
        """Index the members of ``path`` and read its manifest, within ``limits``."""
        where = repr(str(path))
        handle = open(path, "rb")  # noqa: SIM115 - owned by the returned checkpoint
        try:
            members = _index(handle, os.fstat(handle.fileno()).st_size, limits, where)
            offset, size = members.pop(MANIFEST)
            if size > limits.max_manifest_bytes:
                raise SerializationError(
                    f"{where}: manifest.json is {size} bytes, more than max_manifest_bytes="
                    f"{limits.max_manifest_bytes}; if you trust this file, pass a larger "
                    "max_manifest_bytes="
                )
            handle.seek(offset)
            manifest = handle.read(size)
        except BaseException:
            handle.close()
            raise
        return _TarCheckpoint(handle, members, manifest, where)


def _index(
    handle: BinaryIO, file_size: int, limits: Limits, where: str
) -> dict[str, tuple[int, int]]:
    """Return ``name -> (data offset, size)`` for every member, refusing anything unusual."""
    members: dict[str, tuple[int, int]] = {}
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
            members[info.name] = (info.offset_data, info.size)
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
        self, handle: BinaryIO, members: dict[str, tuple[int, int]], manifest: bytes, where: str
    ) -> None:
        self.handle = handle
        self.members = members
        self.manifest = manifest
        self.where = where

    def close(self) -> None:
        self.handle.close()

    def read_arrays(
        self, table: Mapping[str, ArraySpec], wanted: Mapping[str, Any]
    ) -> dict[str, Any]:
        names: dict[str, tuple[str, Order]] = {}  # member name -> (key, order)
        for key in table:
            fortran = _member_name(key, "F")
            names[fortran if fortran in self.members else _member_name(key, "C")] = (
                key,
                "F" if fortran in self.members else "C",
            )
        if set(self.members) != set(names):
            extra = sorted(set(self.members) - set(names))[:5]
            missing = sorted(set(names) - set(self.members))[:5]
            raise SerializationError(
                f"{self.where}: the archive must hold exactly the arrays the manifest names "
                f"(unexpected members: {extra}, missing members: {missing})"
            )
        # Every size is checked before any array is allocated.
        for name, (key, _) in names.items():
            size, nbytes = self.members[name][1], table[key][2]
            if size != nbytes:
                raise SerializationError(
                    f"{self.where}: member {name!r} holds {size} bytes, but array {key!r} "
                    f"needs {nbytes}"
                )
        out: dict[str, Any] = {}
        for name, (key, order) in names.items():
            if key not in wanted:
                continue  # partial restore: never read
            nbytes = table[key].nbytes
            arr = empty_array(table[key], order)  # 64-byte aligned, as the contract asks
            self.handle.seek(self.members[name][0])
            flat = arr.reshape(-1, order=order).view(np.uint8)
            view = memoryview(flat)  # pyright: ignore[reportArgumentType]  # numpy stubs lack __buffer__
            if nbytes and self.handle.readinto(view) != nbytes:  # type: ignore[attr-defined]
                raise SerializationError(f"{self.where}: member {name!r} is truncated")
            out[key] = place(arr, wanted[key])
        return out


@hookimpl
def jaxstruct_register_formats() -> Sequence[Format]:
    """Provide the ``tar`` format (chosen for export paths ending in ``.tar``)."""
    return [TarFormat()]
