"""On-disk formats: the :class:`Format` interface and the two built-in formats.

``directory`` writes ``manifest.json`` next to ``arrays.npz``; ``zip`` writes
one archive holding ``manifest.json`` and the ``.npy`` members. Array members
are named ``<key>.npy``, so ``numpy.load(..., allow_pickle=False)`` reads them.
Publishing (temporary sibling, fsync, atomic rename) is not a format's job:
:func:`jaxstruct.io.export` hands each format a fresh path to create.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from jaxstruct.registry import SerializationError

from . import _zip
from ._atomic import fsync_dir
from ._dtypes import storage_dtype
from ._files import open_regular
from ._limits import Limits
from ._npy import array_bytes, build_header, parse_header, prefix_length

__all__ = ["DirectoryFormat", "Format", "OpenedCheckpoint", "ZipFormat"]

MANIFEST = "manifest.json"
ARRAYS = "arrays.npz"

ArrayTable = Mapping[str, tuple[np.dtype, tuple[int, ...], int]]


class OpenedCheckpoint:
    """A checkpoint opened for reading: its manifest bytes, and its arrays on demand."""

    manifest: bytes

    def read_arrays(self, table: ArrayTable) -> dict[str, np.ndarray]:
        """Return every array of ``table`` (``key -> (dtype, shape, nbytes)``), checked."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the files."""


class Format:
    """Base class of on-disk formats; subclass it in a plugin and return an instance from
    ``jaxstruct_register_formats``.

    Attributes:
        name: unique name, recorded in the manifest's ``container`` entry.
        suffixes: path suffixes that select this format on export (``(".zip",)``).
        is_directory: whether a checkpoint of this format is a directory.

    Example:
        >>> ZipFormat().name, ZipFormat().suffixes
        ('zip', ('.zip',))
    """

    name: str = ""
    suffixes: tuple[str, ...] = ()
    is_directory: bool = False

    def write(
        self,
        target: Path,
        manifest: bytes,
        arrays: Mapping[str, np.ndarray],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        """Create ``target`` (which does not exist) holding ``manifest`` and ``arrays``, fsynced."""
        raise NotImplementedError

    def sniff(self, path: Path) -> bool:
        """Return whether ``path`` (an existing file or directory) looks like this format.

        The default claims nothing, so a write-only format never captures a load.
        """
        return False

    def open(self, path: Path, limits: Limits) -> OpenedCheckpoint:
        """Open ``path`` for reading, enforcing ``limits`` before allocating."""
        raise NotImplementedError


def _members(arrays: Mapping[str, np.ndarray]) -> list[_zip.Member]:
    members = []
    for key, arr in arrays.items():
        stored = (
            arr.view(storage_dtype(arr.dtype)) if arr.dtype != storage_dtype(arr.dtype) else arr
        )
        data, fortran = array_bytes(stored)
        header = build_header(stored.dtype, arr.shape, fortran)
        members.append(_zip.Member(f"{key}.npy", (header, data)))
    return members


def _write_file(path: Path, write: Callable[[Any], None]) -> None:
    with open(path, "xb", buffering=0) as handle:
        write(handle)
        os.fsync(handle.fileno())


class _NpzCheckpoint(OpenedCheckpoint):
    """Arrays stored as ``<key>.npy`` members of a checked zip index."""

    def __init__(
        self, fd: int, index: _zip.ZipIndex, where: str, manifest: bytes, extra: frozenset[str]
    ) -> None:
        self.fd = fd
        self.index = index
        self.where = where
        self.manifest = manifest
        self.extra = extra  # members that are not arrays (the zip format's manifest)

    def close(self) -> None:
        os.close(self.fd)

    def read_arrays(self, table: ArrayTable) -> dict[str, np.ndarray]:
        names = {f"{key}.npy": key for key in table}
        present = set(self.index.entries) - self.extra
        if present != set(names):
            extra = sorted(present - set(names))[:5]
            missing = sorted(set(names) - present)[:5]
            raise SerializationError(
                f"{self.where}: the archive must hold exactly the arrays the manifest names "
                f"(unexpected members: {extra}, missing members: {missing})"
            )
        # Check every member's declared size before allocating anything.
        for name, key in names.items():
            entry = self.index.entries[name]
            nbytes = table[key][2]
            if entry.size < nbytes or entry.size > nbytes + (1 << 20):
                raise SerializationError(
                    f"{self.where}: member {name!r} holds {entry.size} bytes, which does not "
                    f"match the {nbytes} bytes of array {key!r} in the manifest"
                )
        keys = list(table)
        if len(keys) <= 1:
            return {k: self._read_one(k, table[k]) for k in keys}
        with concurrent.futures.ThreadPoolExecutor(
            _zip.WORKERS, thread_name_prefix="jaxstruct-load"
        ) as pool:
            results = list(pool.map(lambda k: self._read_one(k, table[k]), keys))
        return dict(zip(keys, results, strict=True))

    def _read_one(self, key: str, spec: tuple[np.dtype, tuple[int, ...], int]) -> np.ndarray:
        dtype, shape, nbytes = spec
        name = f"{key}.npy"
        entry = self.index.entries[name]
        where = f"{self.where}: member {name!r}"
        reader = _zip.MemberReader(self.fd, entry, self.where)
        first = reader.read(min(10, entry.size))
        prefix, hlen = prefix_length(first, where)
        if prefix == 12:
            first += reader.read(2)
        if prefix + hlen + nbytes != entry.size:
            raise SerializationError(f"{where}: size does not match the array's dtype and shape")
        descr, fortran, file_shape = parse_header(reader.read(hlen), where)
        stored = storage_dtype(dtype)
        if descr != stored.str or file_shape != shape:
            raise SerializationError(
                f"{where}: holds dtype {descr!r} and shape {file_shape}, but the manifest says "
                f"{stored.str!r} and {shape}"
            )
        order = "F" if fortran else "C"
        if nbytes == 0:
            arr = np.empty(shape, dtype=stored, order=order)
        else:
            buf = np.empty(nbytes, dtype=np.uint8)
            reader.readinto(memoryview(buf))  # pyright: ignore[reportArgumentType]  # numpy stubs lack __buffer__
            arr = buf.view(stored).reshape(shape, order=order)
        reader.finish()
        return arr.view(dtype) if stored != dtype else arr


def _read_member(fd: int, entry: _zip.Entry, where: str) -> bytes:
    reader = _zip.MemberReader(fd, entry, where)
    data = reader.read(entry.size)
    reader.finish()
    return data


class DirectoryFormat(Format):
    """A directory holding ``manifest.json`` and ``arrays.npz``."""

    name = "directory"
    suffixes = ()
    is_directory = True

    def write(
        self,
        target: Path,
        manifest: bytes,
        arrays: Mapping[str, np.ndarray],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        target.mkdir()
        step("temp-created")
        _write_file(
            target / ARRAYS,
            lambda h: _zip.write_zip(
                h, _members(arrays), compression=compression, after_member=step
            ),
        )
        step("arrays-written")
        _write_file(target / MANIFEST, lambda h: h.write(manifest))
        step("manifest-written")
        fsync_dir(target)
        step("temp-synced")

    def sniff(self, path: Path) -> bool:
        return path.is_dir() and (path / MANIFEST).exists()

    def open(self, path: Path, limits: Limits) -> OpenedCheckpoint:
        where = repr(str(path))
        fd, size = open_regular(path / MANIFEST, follow=False)
        try:
            if size > limits.max_manifest_bytes:
                raise SerializationError(
                    f"{where}: manifest.json is {size} bytes, more than max_manifest_bytes="
                    f"{limits.max_manifest_bytes}; if you trust this file, pass a larger "
                    "max_manifest_bytes="
                )
            from ._files import read_all

            manifest = read_all(fd, size, where)
        finally:
            os.close(fd)
        try:
            fd, size = open_regular(path / ARRAYS, follow=False)
        except FileNotFoundError:
            raise SerializationError(f"{where}: arrays.npz is missing") from None
        try:
            index = _zip.read_index(
                fd, size, f"{where} (arrays.npz)", max_ratio=limits.max_inflation_ratio
            )
        except BaseException:
            os.close(fd)
            raise
        return _NpzCheckpoint(fd, index, f"{where} (arrays.npz)", manifest, frozenset())


class ZipFormat(Format):
    """One zip archive holding ``manifest.json`` and the ``.npy`` array members."""

    name = "zip"
    suffixes = (".zip",)
    is_directory = False

    def write(
        self,
        target: Path,
        manifest: bytes,
        arrays: Mapping[str, np.ndarray],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        members = [_zip.Member(MANIFEST, (manifest,), text=True), *_members(arrays)]
        # The manifest member is always deflated unless compression="none".
        _write_file(
            target,
            lambda h: _zip.write_zip(h, members, compression=compression, after_member=step),
        )
        step("temp-synced")

    def sniff(self, path: Path) -> bool:
        if not path.is_file():
            return False
        with open(path, "rb") as handle:
            return handle.read(4) in (b"PK\x03\x04", b"PK\x05\x06")

    def open(self, path: Path, limits: Limits) -> OpenedCheckpoint:
        where = repr(str(path))
        fd, size = open_regular(path, follow=True)
        try:
            index = _zip.read_index(fd, size, where, max_ratio=limits.max_inflation_ratio)
            entry = index.entries.get(MANIFEST)
            if entry is None:
                raise SerializationError(f"{where}: the archive has no manifest.json")
            if entry.size > limits.max_manifest_bytes:
                raise SerializationError(
                    f"{where}: manifest.json is {entry.size} bytes, more than "
                    f"max_manifest_bytes={limits.max_manifest_bytes}; if you trust this file, "
                    "pass a larger max_manifest_bytes="
                )
            manifest = _read_member(fd, entry, where)
        except BaseException:
            os.close(fd)
            raise
        return _NpzCheckpoint(fd, index, where, manifest, frozenset({MANIFEST}))
