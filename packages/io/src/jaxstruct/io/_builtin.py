"""The two built-in formats: a directory and a zip archive holding the same two files.

A checkpoint is ``manifest.json`` plus ``arrays.npz``, an ordinary NumPy
``.npz`` archive whose members ``<key>.npy`` are the arrays
(``numpy.load(..., allow_pickle=False)`` reads it). The ``directory`` format
stores the two files in a directory; the ``zip`` format stores them as the two
members of one archive, ``arrays.npz`` uncompressed, so unzipping it gives a
directory checkpoint. (Archives of the first release held the ``.npy`` members
next to ``manifest.json``; they are still read.)

Reading never copies array data it does not have to: a stored member is read
with ``preadv`` straight into a 64-byte-aligned buffer, which ``jax.device_put``
adopts without a copy on the CPU; one array is read at a time, so the peak is
the data itself. With a :class:`jax.sharding.Sharding` placement only the rows
each addressable device needs are read (a deflated member is decompressed once
and sliced on the way). Writing takes a sharded ``jax.Array`` shard by shard,
never gathering it into one host buffer.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from jaxstruct.registry import SerializationError

from . import _gc, _zip, _zipread
from ._crc import crc32
from ._dtypes import storage_dtype
from ._files import open_noatime, open_regular, read_all
from ._formats import Format, OpenedCheckpoint
from ._limits import Limits
from ._manifest import check_node_budget
from ._npy import array_bytes, build_header, parse_header, prefix_length
from ._sync import fsync_all

__all__ = ["ARRAYS", "MANIFEST", "DirectoryFormat", "ZipFormat", "aligned_empty"]

MANIFEST = "manifest.json"
ARRAYS = "arrays.npz"
_ALIGN = 64
_READ_CHUNK = 1 << 20  # CRC each piece while it is still in the cache
_SLAB = 8 << 20  # bytes of rows assembled at a time from the shards of a sharded array
_SMALL_MEMBER = 64 << 10  # a single-device jax.Array up to this size is copied to the host whole

ArrayTable = Mapping[str, Any]  # key -> ArraySpec(dtype, shape, nbytes)


def aligned_empty(nbytes: int) -> np.ndarray:
    """Return an uninitialised ``uint8`` buffer of ``nbytes`` whose address is 64-byte aligned.

    Example:
        >>> aligned_empty(100).ctypes.data % 64
        0
    """
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + nbytes]


# ----------------------------------------------------------------------------- writing


def _is_jax_array(value: Any) -> bool:
    cls = type(value)
    # Looked up on the class: on the instance, the property would build every shard.
    return cls.__module__.startswith(("jax", "jaxlib")) and hasattr(cls, "addressable_shards")


def _norm_index(index: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    out = []
    for sl, n in zip(index, shape, strict=False):
        start, stop, _ = sl.indices(n)
        out.append((start, stop))
    out += [(0, n) for n in shape[len(out) :]]
    return tuple(out)


def _host(data: Any, stored: np.dtype) -> np.ndarray:
    # The shard's own Array object is temporary: the host view cached on it
    # by numpy conversion goes away with it, never staying on the user's array.
    host = np.asarray(data)
    return host.view(stored) if host.dtype != stored else host


def _jax_member(name: str, arr: Any) -> _zip.Member:
    """A ``.npy`` member streamed from the shards of a ``jax.Array`` (replica 0 of each)."""
    shape = tuple(arr.shape)
    stored = storage_dtype(np.dtype(arr.dtype))
    if not arr.is_fully_addressable and not arr.is_fully_replicated:
        raise SerializationError(
            f"array {name!r} is sharded across processes and this process does not hold all "
            'of it; the built-in formats write from one process: export with format="orbax"'
        )
    header = build_header(stored, shape, False)
    nbytes = math.prod(shape) * stored.itemsize
    shards = [s for s in arr.addressable_shards if s.replica_id == 0]
    if arr.is_fully_replicated or len(shards) == 1:
        shards = shards[:1]
    blocks = sorted(((_norm_index(s.index, shape), s) for s in shards), key=lambda b: b[0])
    covered = sum(math.prod(b - a for a, b in idx) for idx, _ in blocks)
    if covered != math.prod(shape):
        raise SerializationError(
            f"array {name!r}: its addressable shards do not cover it exactly once; "
            'export with format="orbax"'
        )

    def chunks() -> Iterator[_zip.Chunk]:
        yield header
        if nbytes == 0:
            return
        if len(shape) == 0 or len(blocks) == 1:
            host = _host(blocks[0][1].data, stored)
            yield memoryview(np.ascontiguousarray(host).reshape(-1).view(np.uint8))  # pyright: ignore[reportArgumentType]
            return
        row = math.prod(shape[1:]) * stored.itemsize
        rows_per = max(1, _SLAB // max(row, 1))
        by_rows: dict[tuple[int, int], list[tuple[tuple[tuple[int, int], ...], Any]]] = {}
        for idx, shard in blocks:
            by_rows.setdefault(idx[0], []).append((idx, shard))
        for (r0, r1), group in sorted(by_rows.items()):
            hosts = [(idx, _host(shard.data, stored)) for idx, shard in group]
            full = len(group) == 1 and all(
                a == 0 and b == n for (a, b), n in zip(group[0][0][1:], shape[1:], strict=True)
            )
            if full:
                yield memoryview(np.ascontiguousarray(hosts[0][1]).reshape(-1).view(np.uint8))  # pyright: ignore[reportArgumentType]
                continue
            for s0 in range(r0, r1, rows_per):
                s1 = min(r1, s0 + rows_per)
                slab = np.empty((s1 - s0, *shape[1:]), stored)
                for idx, host in hosts:
                    where = (slice(None), *(slice(a, b) for a, b in idx[1:]))
                    slab[where] = host[s0 - r0 : s1 - r0]
                yield memoryview(slab.reshape(-1).view(np.uint8))  # pyright: ignore[reportArgumentType]

    return _zip.Member(name, len(header) + nbytes, chunks)


def _small_jax_member(name: str, arr: Any) -> _zip.Member | None:
    """A small ``jax.Array`` held whole by one device: its bytes, copied now (else ``None``).

    Checkpoints of many small arrays spend most of their export here, and
    one host copy of a few KiB costs less than walking the shards.
    """
    stored = storage_dtype(np.dtype(arr.dtype))
    if arr.size * stored.itemsize > _SMALL_MEMBER or len(arr.sharding.device_set) != 1:
        return None
    # addressable_data(0) is a fresh Array: the host copy numpy caches on it
    # goes away with it, never staying on the user's array.
    host = np.asarray(arr.addressable_data(0))
    host = host.view(stored) if host.dtype != stored else host
    data, fortran = array_bytes(host)
    return _zip.Member.of(name, (build_header(stored, host.shape, fortran), data))


def _member(key: str, arr: Any) -> _zip.Member:
    name = f"{key}.npy"
    if _is_jax_array(arr):
        return _small_jax_member(name, arr) or _jax_member(name, arr)
    arr = np.asarray(arr)
    stored_dtype = storage_dtype(arr.dtype)
    stored = arr.view(stored_dtype) if arr.dtype != stored_dtype else arr
    data, fortran = array_bytes(stored)
    header = build_header(stored.dtype, arr.shape, fortran)
    return _zip.Member.of(name, (header, data))


def _members(arrays: Mapping[str, Any]) -> list[_zip.Member]:
    with _gc.paused():
        return [_member(key, arr) for key, arr in arrays.items()]


def _create(path: Path) -> Any:
    return open(path, "xb", buffering=0)


def _write_npz(
    handle: Any, arrays: Mapping[str, Any], compression: str, step: Callable[[str], None]
) -> tuple[int, int]:
    return _zip.write_zip(handle, _members(arrays), compression=compression, after_member=step)


# ----------------------------------------------------------------------------- reading


class _Placed:
    """What one device of a sharded read gets: its rows range and its buffer."""

    def __init__(self, index: tuple[tuple[int, int], ...], dtype: np.dtype) -> None:
        self.index = index
        self.array = np.empty(tuple(b - a for a, b in index), dtype)


def _rows_needed(index: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    return index[0] if index else (0, 1)


class _NpzCheckpoint(OpenedCheckpoint):
    """Arrays stored as ``<key>.npy`` members of a checked zip index."""

    def __init__(
        self, fd: int, index: _zipread.ZipIndex, where: str, manifest: bytes, extra: frozenset[str]
    ) -> None:
        self.fd = fd
        self.index = index
        self.where = where
        self.manifest = manifest
        self.extra = extra  # members that are not arrays (a legacy zip's manifest)
        self.container: _zipread.Entry | None = None  # arrays.npz inside a zip, for verify()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def check_members(self, table: ArrayTable) -> None:
        """Check that the archive holds exactly the arrays of ``table``, with plausible sizes."""
        names = {f"{key}.npy": key for key in table}
        present = set(self.index.entries) - self.extra
        if present != set(names):
            extra = sorted(present - set(names))[:5]
            missing = sorted(set(names) - present)[:5]
            raise SerializationError(
                f"{self.where}: the archive must hold exactly the arrays the manifest names "
                f"(unexpected members: {extra}, missing members: {missing})"
            )
        for name, key in names.items():
            entry = self.index.entries[name]
            nbytes = table[key][2]
            if entry.size < nbytes or entry.size > nbytes + (1 << 20):
                raise SerializationError(
                    f"{self.where}: member {name!r} holds {entry.size} bytes, which does not "
                    f"match the {nbytes} bytes of array {key!r} in the manifest"
                )

    def verify(self, table: ArrayTable) -> list[str]:
        """Read every member through, checking sizes, CRCs, dtypes and shapes; list what is bad.

        Nothing is kept: each member streams through one scratch buffer.
        """
        problems: list[str] = []
        if self.container is not None:
            try:
                reader = _zipread.MemberReader(self.fd, self.container, self.where)
                _drain(reader, self.container.size)
                reader.finish()
            except SerializationError as err:
                problems.append(str(err))
        names = {f"{key}.npy": key for key in table}
        present = set(self.index.entries) - self.extra
        problems += [
            f"{self.where}: member {name!r} is missing" for name in sorted(set(names) - present)
        ]
        problems += [
            f"{self.where}: member {name!r} is not an array of the manifest"
            for name in sorted(present - set(names))
        ]
        for name in sorted(present & set(names)):
            entry = self.index.entries[name]
            spec = table[names[name]]
            try:
                reader = _zipread.MemberReader(self.fd, entry, self.where, self.index)
                _, _, start = self._header(reader, name, spec)
                _drain(reader, entry.size - start)
                reader.finish()
            except SerializationError as err:
                problems.append(str(err))
        return problems

    def read_arrays(
        self, table: ArrayTable, wanted: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Read the arrays of ``wanted`` (default: all of ``table``), one at a time.

        A ``None`` placement gives a 64-byte-aligned host array; a ``Sharding``
        gives a ``jax.Array`` built from the slices each addressable device needs.
        """
        self.check_members(table)
        keys = list(table) if wanted is None else list(wanted)
        out: dict[str, Any] = {}
        # The CRCs of big members are checked at the end: they are computed on the
        # CRC threads while the next members are read, never waited for in between.
        checks: list[Callable[[], None]] = []
        for key in keys:
            placement = None if wanted is None else wanted[key]
            out[key] = self.read_one(key, table[key], placement, checks)
        for check in checks:
            check()
        return out

    def _header(
        self, reader: _zipread.MemberReader, name: str, spec: Any
    ) -> tuple[np.dtype, bool, int]:
        dtype, shape, nbytes = spec[0], tuple(spec[1]), spec[2]
        where = f"{self.where}: member {name!r}"
        entry = self.index.entries[name]
        first = reader.read(min(10, entry.size))
        prefix, hlen = prefix_length(first, where)
        if prefix == 12:
            reader.read(2)
        if prefix + hlen + nbytes != entry.size:
            raise SerializationError(f"{where}: size does not match the array's dtype and shape")
        descr, fortran, file_shape = parse_header(reader.read(hlen), where)
        stored = storage_dtype(dtype)
        if descr != stored.str or file_shape != shape:
            raise SerializationError(
                f"{where}: holds dtype {descr!r} and shape {file_shape}, but the manifest says "
                f"{stored.str!r} and {shape}"
            )
        return stored, fortran, prefix + hlen

    def _read_cached(self, name: str, entry: _zipread.Entry, spec: Any) -> np.ndarray | None:
        """A stored member that the index holds in memory, exactly as export writes it.

        Its header must be the very bytes export writes for the manifest's
        dtype and shape (so nothing needs parsing); anything else, or a member
        not in memory, returns ``None`` for the general path to read and judge.
        """
        raw = self.index.cached(entry.data_offset, entry.csize)
        if raw is None:
            return None
        dtype, shape, nbytes = spec[0], tuple(spec[1]), spec[2]
        stored = storage_dtype(dtype)
        header = build_header(stored, shape, False)
        if len(raw) != len(header) + nbytes or raw[: len(header)] != header:
            return None
        if crc32(raw) != entry.crc:
            raise SerializationError(
                f"{self.where}: member {name!r}: CRC mismatch: the data is corrupt"
            )
        arr = np.frombuffer(raw, stored, math.prod(shape), len(header)).reshape(shape).copy()
        return arr.view(dtype) if stored != dtype else arr

    def read_one(
        self,
        key: str,
        spec: Any,
        placement: Any = None,
        checks: list[Callable[[], None]] | None = None,
    ) -> Any:
        """Read one array: a host array (``placement=None``) or a ``jax.Array`` placed as asked.

        With ``checks``, a CRC still being computed is left there to check later.
        """
        dtype, shape, nbytes = spec[0], tuple(spec[1]), spec[2]
        name = f"{key}.npy"
        entry = self.index.entries[name]
        if placement is None and entry.method == 0 and nbytes:
            found = self._read_cached(name, entry, spec)
            if found is not None:
                return found
        reader = _zipread.MemberReader(self.fd, entry, self.where, self.index)
        stored, fortran, start = self._header(reader, name, spec)
        if placement is not None and not fortran and len(shape) > 0 and nbytes > 0:
            return self._read_placed(
                reader,
                entry,
                start=start,
                stored=stored,
                dtype=dtype,
                shape=shape,
                sharding=placement,
            )
        order = "F" if fortran else "C"
        if nbytes == 0:
            arr = np.empty(shape, dtype=stored, order=order)
        else:
            buf = aligned_empty(nbytes)
            view = memoryview(buf)  # pyright: ignore[reportArgumentType]  # numpy stubs lack __buffer__
            # Each piece lands in its own part of buf, so its CRC can be computed
            # on another thread while the next one is read.
            step = _READ_CHUNK
            if reader.check_in_background() and nbytes >= 64 * _READ_CHUNK:
                step = 8 * _READ_CHUNK
            for pos in range(0, nbytes, step):
                reader.readinto(view[pos : pos + step])
            arr = buf.view(stored).reshape(shape, order=order)
        reader.finish(checks)
        arr = arr.view(dtype) if stored != dtype else arr
        if placement is not None:
            import jax

            return jax.device_put(arr, placement)
        return arr

    def _read_placed(
        self,
        reader: _zipread.MemberReader,
        entry: _zipread.Entry,
        *,
        start: int,
        stored: np.dtype,
        dtype: np.dtype,
        shape: tuple[int, ...],
        sharding: Any,
    ) -> Any:
        import jax

        indices = sharding.addressable_devices_indices_map(shape)
        placed: dict[tuple[tuple[int, int], ...], _Placed] = {}
        for index in indices.values():
            norm = _norm_index(index, shape)
            if norm not in placed:
                placed[norm] = _Placed(norm, stored)
        row = math.prod(shape[1:]) * stored.itemsize
        if entry.method == 0:  # stored: read only the rows each device needs
            data = entry.data_offset + start
            for part in placed.values():
                r0, r1 = _rows_needed(part.index)
                self._copy_rows(
                    data + r0 * row, r0, r1, row=row, stored=stored, shape=shape, parts=[part]
                )
        else:  # deflated: decompress once, slice on the way
            rows_per = max(1, _SLAB // max(row, 1))
            slab_buf = np.empty(rows_per * row, np.uint8)
            for s0 in range(0, shape[0], rows_per):
                s1 = min(shape[0], s0 + rows_per)
                view = memoryview(slab_buf)[: (s1 - s0) * row]  # pyright: ignore[reportArgumentType]
                reader.readinto(view)
                slab = slab_buf[: (s1 - s0) * row].view(stored).reshape((s1 - s0, *shape[1:]))
                _scatter(slab, s0, s1, list(placed.values()))
            reader.finish()
        arrays = []
        for device, index in indices.items():
            host = placed[_norm_index(index, shape)].array
            host = host.view(dtype) if stored != dtype else host
            arrays.append(jax.device_put(host, device))
        return jax.make_array_from_single_device_arrays(shape, sharding, arrays)

    def _copy_rows(
        self,
        offset: int,
        r0: int,
        r1: int,
        *,
        row: int,
        stored: np.dtype,
        shape: tuple[int, ...],
        parts: list[_Placed],
    ) -> None:
        full = all(
            a == 0 and b == n
            for p in parts
            for (a, b), n in zip(p.index[1:], shape[1:], strict=True)
        )
        if full and len(parts) == 1:  # whole rows: read straight into the buffer
            view = memoryview(parts[0].array.reshape(-1).view(np.uint8))  # pyright: ignore[reportArgumentType]
            _pread_exact(self.fd, view, offset, self.where)
            return
        rows_per = max(1, _SLAB // max(row, 1))
        slab_buf = np.empty(rows_per * row, np.uint8)
        for s0 in range(r0, r1, rows_per):
            s1 = min(r1, s0 + rows_per)
            view = memoryview(slab_buf)[: (s1 - s0) * row]  # pyright: ignore[reportArgumentType]
            _pread_exact(self.fd, view, offset + (s0 - r0) * row, self.where)
            slab = slab_buf[: (s1 - s0) * row].view(stored).reshape((s1 - s0, *shape[1:]))
            _scatter(slab, s0, s1, parts)


def _drain(reader: _zipread.MemberReader, n: int) -> None:
    scratch = memoryview(bytearray(min(n, _READ_CHUNK) or 1))
    done = 0
    while done < n:
        take = min(len(scratch), n - done)
        reader.readinto(scratch[:take])
        done += take


def _scatter(slab: np.ndarray, s0: int, s1: int, parts: list[_Placed]) -> None:
    """Copy rows ``s0:s1`` (held in ``slab``) into every part that needs some of them."""
    for part in parts:
        a, b = _rows_needed(part.index)
        lo, hi = max(a, s0), min(b, s1)
        if lo >= hi:
            continue
        src = (slice(lo - s0, hi - s0), *(slice(x, y) for x, y in part.index[1:]))
        part.array[lo - a : hi - a] = slab[src]


def _pread_exact(fd: int, view: memoryview, offset: int, where: str) -> None:
    done = 0
    while done < view.nbytes:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise SerializationError(f"{where}: file ended early")
        done += got


def _read_member(
    fd: int, entry: _zipread.Entry, where: str, index: _zipread.ZipIndex | None = None
) -> bytes:
    reader = _zipread.MemberReader(fd, entry, where, index)
    data = reader.read(entry.size)
    reader.finish()
    return data


def _manifest_too_big(where: str, size: int, limits: Limits) -> SerializationError:
    return SerializationError(
        f"{where}: manifest.json is {size} bytes, more than max_manifest_bytes="
        f"{limits.max_manifest_bytes}; if you trust this file, pass a larger "
        "max_manifest_bytes="
    )


_MANIFEST_START = b'{"format":"jaxstruct"'
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


class DirectoryFormat(Format):
    """A directory holding ``manifest.json`` and ``arrays.npz``."""

    name = "directory"
    suffixes = ()
    is_directory = True
    also_reads = ("zip",)  # an unzipped .zip checkpoint is a directory checkpoint

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
        with _create(target / ARRAYS) as npz:
            _write_npz(npz, arrays, compression, step)
            step("arrays-written")
            with _create(target / MANIFEST) as man:
                man.write(manifest)
                step("manifest-written")
                dirfd = os.open(target, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
                try:
                    fsync_all([npz.fileno(), man.fileno()], [dirfd], npz.tell() + len(manifest))
                finally:
                    os.close(dirfd)
        step("temp-synced")

    def sniff(self, path: Path) -> bool:
        return path.is_dir() and (path / MANIFEST).exists()

    def owns(self, path: Path) -> bool:
        """Whether ``path`` is a checkpoint written by this format (which ``overwrite`` replaces).

        One small read, not a full open: the manifest must start as export writes it.
        """
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
            fd = open_noatime(path / MANIFEST, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return False
        try:
            return os.read(fd, len(_MANIFEST_START)) == _MANIFEST_START
        except OSError:
            return False
        finally:
            os.close(fd)

    def open(self, path: Path, limits: Limits) -> _NpzCheckpoint:
        where = repr(str(path))
        fd, size = open_regular(path / MANIFEST, follow=False)
        try:
            if size > limits.max_manifest_bytes:
                raise _manifest_too_big(where, size, limits)
            manifest = read_all(fd, size, where)
        finally:
            os.close(fd)
        check_node_budget(manifest, where, limits.max_nodes)
        try:
            fd, size = open_regular(path / ARRAYS, follow=False)
        except FileNotFoundError:
            raise SerializationError(f"{where}: arrays.npz is missing") from None
        try:
            index = _zipread.read_index(
                fd, size, f"{where} (arrays.npz)", max_ratio=limits.max_inflation_ratio
            )
        except BaseException:
            os.close(fd)
            raise
        return _NpzCheckpoint(fd, index, f"{where} (arrays.npz)", manifest, frozenset())


class ZipFormat(Format):
    """One zip archive holding ``manifest.json`` and ``arrays.npz`` (stored)."""

    name = "zip"
    suffixes = (".zip",)
    is_directory = False
    also_reads = ("directory",)  # a zipped directory checkpoint is a zip checkpoint

    def write(
        self,
        target: Path,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        members = _members(arrays)  # refuse what cannot be written before creating anything
        with _create(target) as handle:
            # The manifest member is deflated unless compression="none".
            text = _zip.Member.of(MANIFEST, [manifest], text=True)
            method, crc, size, csize, payload = _zip.prepare_text(
                text, "none" if compression == "none" else "deflate"
            )
            handle.write(_zip.local_header(MANIFEST, method, crc, size, csize))
            for chunk in payload:
                _write_all(handle, chunk)
            arrays_at = handle.tell()
            handle.write(_zip.stored_header(ARRAYS))
            inner_size, inner_crc = _zip.write_zip(
                handle, members, compression=compression, after_member=step
            )
            os.pwrite(
                handle.fileno(), _zip.patch_stored_header(ARRAYS, inner_size, inner_crc), arrays_at
            )
            central = handle.tell()
            _zip.write_outer(
                handle,
                [
                    (MANIFEST, 0, method, crc, size, csize, 0),
                    (ARRAYS, arrays_at, 0, inner_crc, inner_size, inner_size, 1),
                ],
                central,
            )
            os.fsync(handle.fileno())
        step("temp-synced")

    def sniff(self, path: Path) -> bool:
        if not path.is_file():
            return False
        fd = open_noatime(path, os.O_RDONLY)
        try:
            return os.pread(fd, 4, 0) in _ZIP_MAGIC
        finally:
            os.close(fd)

    def owns(self, path: Path) -> bool:
        """Whether ``path`` is a checkpoint of this format (which ``overwrite`` replaces)."""
        if not path.is_file():
            return False
        fd = open_noatime(path, os.O_RDONLY)
        try:
            if os.pread(fd, 4, 0) not in _ZIP_MAGIC:
                return False
            # The central directory sits at the end: it must name manifest.json.
            size = os.fstat(fd).st_size
            start = max(0, size - (1 << 16))
            return b"manifest.json" in os.pread(fd, size - start, start)
        finally:
            os.close(fd)

    def open(self, path: Path, limits: Limits) -> _NpzCheckpoint:
        where = repr(str(path))
        fd, size = open_regular(path, follow=True)
        try:
            outer = _zipread.read_index(fd, size, where, max_ratio=limits.max_inflation_ratio)
            entry = outer.entries.get(MANIFEST)
            if entry is None:
                raise SerializationError(f"{where}: the archive has no manifest.json")
            if entry.size > limits.max_manifest_bytes:
                raise _manifest_too_big(where, entry.size, limits)
            manifest = _read_member(fd, entry, where, outer)
            check_node_budget(manifest, where, limits.max_nodes)
            npz = outer.entries.get(ARRAYS)
            if npz is None:  # the first release's layout: .npy members beside the manifest
                return _NpzCheckpoint(fd, outer, where, manifest, frozenset({MANIFEST}))
            if set(outer.entries) != {MANIFEST, ARRAYS}:
                raise SerializationError(
                    f"{where}: the archive must hold exactly manifest.json and arrays.npz, "
                    f"not {sorted(outer.entries)[:6]}"
                )
            if npz.method != 0:
                raise SerializationError(
                    f"{where}: arrays.npz is compressed inside the archive; it must be stored "
                    "(zip it again without compression, e.g. zip -0)"
                )
            inner = _zipread.read_index(
                fd,
                npz.size,
                f"{where} (arrays.npz)",
                max_ratio=limits.max_inflation_ratio,
                base=npz.data_offset,
                data=outer.cached(npz.data_offset, npz.size),
            )
        except BaseException:
            os.close(fd)
            raise
        opened = _NpzCheckpoint(fd, inner, f"{where} (arrays.npz)", manifest, frozenset())
        opened.container = npz
        return opened


def _write_all(handle: Any, data: _zip.Chunk) -> None:
    view = memoryview(data)
    while view.nbytes:
        n = handle.write(view)
        view = view[n or 0 :]
