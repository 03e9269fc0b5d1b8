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
from typing import Any, NamedTuple

import numpy as np
from jaxstruct.registry import SerializationError

from . import _zip
from ._atomic import fsync_dir
from ._dtypes import storage_dtype
from ._files import open_regular
from ._limits import Limits
from ._npy import array_bytes, build_header, parse_header, prefix_length

__all__ = [
    "ArraySpec",
    "DirectoryFormat",
    "Format",
    "OpenedCheckpoint",
    "PendingWrite",
    "Placement",
    "ZipFormat",
    "host_array",
    "host_pieces",
    "place",
]

MANIFEST = "manifest.json"
ARRAYS = "arrays.npz"


class ArraySpec(NamedTuple):
    """What the manifest says about one stored array: dtype, shape and size in bytes."""

    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int


#: Where :meth:`OpenedCheckpoint.read_arrays` puts an array: a sharding, or ``None`` for host.
Placement = Any  # jax.sharding.Sharding | None (jax is imported lazily)

ArrayTable = Mapping[str, ArraySpec]


def host_pieces(arr: Any) -> list[tuple[tuple[slice, ...], np.ndarray]]:
    """Return ``(index, host piece)`` for each distinct block of ``arr`` this process holds.

    A NumPy array is one block. A ``jax.Array`` gives one piece per distinct
    shard index among its addressable shards (replicas once), copied from the
    device shard by shard, so the whole array is never gathered into one
    buffer and no host copy is left cached on the user's array.
    """
    if isinstance(arr, np.ndarray):
        return [((), arr)]
    seen: dict[tuple[Any, ...], tuple[tuple[slice, ...], np.ndarray]] = {}
    for shard in arr.addressable_shards:
        index = tuple(shard.index)
        marker = tuple((s.start, s.stop, s.step) for s in index)
        if marker not in seen:
            seen[marker] = (index, np.asarray(shard.data))
    return list(seen.values())


def host_array(arr: Any) -> np.ndarray:
    """Return ``arr`` as one host NumPy array (a generic fallback for simple formats).

    Built from :func:`host_pieces`; refuses an array whose blocks this
    process does not all hold.
    """
    if isinstance(arr, np.ndarray):
        return arr
    pieces = host_pieces(arr)
    if len(pieces) == 1 and all(
        (s.start in (None, 0)) and (s.stop is None or s.stop == n)
        for s, n in zip(pieces[0][0], arr.shape, strict=False)
    ):
        return pieces[0][1]
    out = np.empty(arr.shape, dtype=arr.dtype)
    covered = 0
    for index, piece in pieces:
        out[index] = piece
        covered += piece.size
    if covered < out.size:
        raise SerializationError(
            f"an array of shape {arr.shape} is not entirely held by this process; "
            'export it with format="orbax", which writes each process\'s shards'
        )
    return out


def place(host: np.ndarray, placement: Placement) -> Any:
    """Put a host array where ``placement`` says: ``None`` keeps it, a sharding makes a jax.Array.

    Each addressable device receives only its own slice (the generic fallback
    for formats that cannot read slices themselves).
    """
    if placement is None:
        return host
    import jax

    if host.dtype == object:  # pragma: no cover - never stored
        raise SerializationError("object arrays cannot be placed on devices")
    return jax.make_array_from_callback(host.shape, placement, lambda index: host[index])


class OpenedCheckpoint:
    """A checkpoint opened for reading: its manifest bytes, and its arrays on demand."""

    manifest: bytes

    def read_arrays(self, table: ArrayTable, wanted: Mapping[str, Placement]) -> dict[str, Any]:
        """Read the arrays named in ``wanted`` and put each where its placement says.

        Args:
            table: the whole arrays table of the manifest, ``key -> ArraySpec``;
                check it against what the container holds.
            wanted: the keys to read (a subset for partial restore; other keys
                are never read) mapped to a placement: ``None`` for a host
                NumPy array, a ``jax.sharding.Sharding`` for a ``jax.Array``
                with exactly that sharding (use :func:`place` as a fallback).

        Returns:
            ``key -> array`` for every key of ``wanted``.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release the files."""


class PendingWrite:
    """A background write started by :meth:`Format.write_async`."""

    def wait(self) -> None:
        """Block until the write is committed; raise its error if it failed."""
        raise NotImplementedError

    def done(self) -> bool:
        """Return whether the write has finished (successfully or not)."""
        raise NotImplementedError


class Format:
    """Base class of on-disk formats; subclass it in a plugin and return an instance from
    ``jaxstruct_register_formats``.

    Attributes:
        name: unique name, recorded in the manifest's ``container`` entry.
        suffixes: path suffixes that select this format on export (``(".zip",)``).
        is_directory: whether a checkpoint of this format is a directory.
        remote_paths: whether URL-like paths (``gs://bucket/ck``) are accepted; a
            format without it only ever sees local paths.
        publishes_atomically: whether :meth:`write` commits the checkpoint
            atomically itself; otherwise :func:`jaxstruct.io.export` hands it a
            fresh temporary sibling and publishes it with an atomic rename.
        multiprocess: whether :meth:`write` and :meth:`open` are called in every
            process of a multi-process run (collectively); otherwise only the
            primary process writes, and arrays it does not hold are refused.

    Example:
        >>> ZipFormat().name, ZipFormat().suffixes
        ('zip', ('.zip',))
    """

    name: str = ""
    suffixes: tuple[str, ...] = ()
    is_directory: bool = False
    remote_paths: bool = False
    publishes_atomically: bool = False
    multiprocess: bool = False

    def write(
        self,
        target: Any,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        """Create ``target`` (which does not exist) holding ``manifest`` and ``arrays``, fsynced.

        ``arrays`` maps keys to ``numpy.ndarray`` or ``jax.Array`` values as the
        user holds them (possibly sharded); write them shard by shard
        (:func:`host_pieces`), never gathering a sharded array into one buffer.
        """
        raise NotImplementedError

    def write_async(
        self,
        target: Any,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> PendingWrite | None:
        """Start writing in the background and return a handle, or ``None`` if unsupported.

        With ``None`` (the default), a non-blocking export runs :meth:`write`
        in a background thread on host copies of the arrays.
        """
        return None

    def sniff(self, path: Any) -> bool:
        """Return whether ``path`` (an existing file or directory) looks like this format.

        The default claims nothing, so a write-only format never captures a load.
        """
        return False

    def open(self, path: Any, limits: Limits) -> OpenedCheckpoint:
        """Open ``path`` for reading, enforcing ``limits`` before allocating."""
        raise NotImplementedError


def _members(arrays: Mapping[str, Any]) -> list[_zip.Member]:
    members = []
    for key, value in arrays.items():
        arr = host_array(value)
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

    def read_arrays(self, table: ArrayTable, wanted: Mapping[str, Placement]) -> dict[str, Any]:
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
        keys = list(wanted)

        def read(k: str) -> Any:
            return place(self._read_one(k, table[k]), wanted[k])

        if len(keys) <= 1:
            return {k: read(k) for k in keys}
        with concurrent.futures.ThreadPoolExecutor(
            _zip.WORKERS, thread_name_prefix="jaxstruct-load"
        ) as pool:
            results = list(pool.map(read, keys))
        return dict(zip(keys, results, strict=True))

    def _read_one(self, key: str, spec: ArraySpec) -> np.ndarray:
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
        arrays: Mapping[str, Any],
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
        arrays: Mapping[str, Any],
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
