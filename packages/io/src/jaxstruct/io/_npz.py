"""The arrays of ``arrays.npz``: ``.npy`` headers, checked reads into aligned buffers, writes."""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import numpy.lib.format as npy_format
from jaxstruct.registry import SerializationError
from zlib_ng.zlib_ng import crc32

from . import _host, _process, _zip
from ._formats import ArrayTable, OpenedCheckpoint, aligned_empty

MAGIC = b"\x93NUMPY"
_MAX_HEADER = 65_535


def storage_dtype(dtype: np.dtype) -> np.dtype:
    """Return the dtype used inside the ``.npy`` member for an array of ``dtype``."""
    if dtype.type.__module__.startswith("ml_dtypes"):
        return np.dtype(f"<u{dtype.itemsize}")
    return dtype


def array_bytes(arr: np.ndarray) -> tuple[memoryview, bool]:
    """Return the raw bytes of ``arr`` in on-disk order, and whether that is Fortran order."""
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


_READ_CHUNK = 1 << 20  # bytes read at a time (each piece's CRC computed apart)
_SLAB = 8 << 20  # bytes of rows decompressed or gathered at a time for a sharded read


def norm_index(index: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    out = []
    for sl, n in zip(index, shape, strict=False):
        start, stop, _ = sl.indices(n)
        out.append((start, stop))
    out += [(0, n) for n in shape[len(out) :]]
    return tuple(out)


class _Placed:
    """What one device of a sharded read gets: its rows range and its buffer."""

    def __init__(self, index: tuple[tuple[int, int], ...], dtype: np.dtype) -> None:
        self.index = index
        shape = tuple(b - a for a, b in index)
        # 64-byte aligned, so that a CPU device adopts the buffer instead of copying it.
        self.array = aligned_empty(math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)


def _rows_needed(index: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    return index[0] if index else (0, 1)


class NpzCheckpoint(OpenedCheckpoint):
    """Arrays stored as ``<key>.npy`` members of a checked zip index."""

    checksum_scheme = "CRC-32 of every member, the manifest's included"
    arrays_checked = True  # a zip member's CRC-32 is always there, and every read checks it

    def __init__(
        self,
        fd: int,
        index: _zip.ZipIndex,
        where: str,
        manifest: bytes,
        extra: frozenset[str],
        *,
        container: _zip.Entry | None = None,
    ) -> None:
        self.fd = fd
        self.index = index
        self.where = where
        self.manifest = manifest
        self.extra = extra  # members that are not arrays (a legacy zip's manifest)
        self.container = container  # arrays.npz inside a zip, for verify()
        self._arena: memoryview | None = None  # see _small_buffer
        self._arena_used = 0

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
        """Read every member through, checking sizes, CRCs, dtypes and shapes; list what is bad."""
        problems: list[str] = []
        if self.container is not None:
            try:
                reader = _zip.MemberReader(self.fd, self.container, self.where)
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
                reader = _zip.MemberReader(self.fd, entry, self.where, self.index)
                _, _, start = self._header(reader, name, spec)
                _drain(reader, entry.size - start)
                reader.finish()
            except SerializationError as err:
                problems.append(str(err))
        return problems

    def read_arrays(
        self, table: ArrayTable, wanted: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Read the arrays of ``wanted`` (default: all of ``table``), one at a time."""
        self.check_members(table)
        keys = list(table) if wanted is None else list(wanted)
        out: dict[str, Any] = {}
        # The CRCs of big members are checked at the end: they are computed on the
        # CRC threads while the next members are read, never waited for in between.
        checks: list[Callable[[], None]] = []
        try:
            for key in keys:
                placement = None if wanted is None else wanted[key]
                out[key] = self.read_one(key, table[key], placement, checks)
        except BaseException:
            # Work still running for earlier members (pieces being inflated into
            # their buffers) ends before the error reaches the caller.
            for check in checks:
                with contextlib.suppress(SerializationError):
                    check()
            raise
        for check in checks:
            check()
        return out

    def _header(
        self, reader: _zip.MemberReader, name: str, spec: Any
    ) -> tuple[np.dtype, bool, int]:
        dtype, shape, nbytes = spec[0], tuple(spec[1]), spec[2]
        where = f"{self.where}: member {name!r}"
        start = self.index.entries[name].size - nbytes  # the header's size, if the member is sound
        if not 0 < start <= _MAX_HEADER + 12:
            raise SerializationError(f"{where}: size does not match the array's dtype and shape")
        stored = storage_dtype(dtype)
        raw = reader.read(start)
        if raw == build_header(stored, shape, False):  # as export writes it: nothing to parse
            return stored, False, start
        head = io.BytesIO(raw)
        try:  # numpy's reader evaluates nothing but literals, of a bounded length
            version = npy_format.read_magic(head)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"unsupported .npy version {version}")
            read = npy_format.read_array_header_1_0
            if version == (2, 0):
                read = npy_format.read_array_header_2_0
            file_shape, fortran, file_dtype = read(head, max_header_size=_MAX_HEADER)
        except Exception as err:  # ValueError, SyntaxError, tokenize.TokenError, ...
            raise SerializationError(f"{where}: malformed .npy header ({err})") from None
        if head.tell() != start:
            raise SerializationError(f"{where}: size does not match the array's dtype and shape")
        if file_dtype != stored or file_shape != shape:
            raise SerializationError(
                f"{where}: holds dtype {file_dtype.str!r} and shape {file_shape}, but the manifest "
                f"says {stored.str!r} and {shape}"
            )
        return stored, fortran, start

    def _read_cached(self, name: str, entry: _zip.Entry, spec: Any) -> np.ndarray | None:
        """A stored member that the index holds in memory, exactly as export writes it."""
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
        # Copied into an aligned buffer, as every array a load returns (JAX adopts it).
        arena, at = self._small_buffer(nbytes)
        arena[at : at + nbytes] = raw[len(header) :]
        arr = np.frombuffer(arena, stored, nbytes // stored.itemsize, at).reshape(shape)
        return arr.view(dtype) if stored != dtype else arr

    def _small_buffer(self, nbytes: int) -> tuple[memoryview, int]:
        """A 64-byte aligned place for ``nbytes`` of a member held in the index's memory:
        ``(buffer, offset)`` in one buffer all such members of this checkpoint share.

        Only a whole archive of at most 64 KiB is held in memory, so the buffer is at
        most that archive's size plus 64 bytes per member; one aligned allocation
        instead of one per array (finding an address through ``ndarray.ctypes`` costs
        more than copying a small array).
        """
        at = self._arena_used
        if self._arena is None or at + nbytes > len(self._arena):
            data = self.index.data
            room = (len(data) if data is not None else 0) + 64 * len(self.index.entries)
            self._arena = memoryview(aligned_empty(max(room, nbytes)))  # pyright: ignore[reportArgumentType]
            at = 0
        self._arena_used = -(-(at + nbytes) // 64) * 64
        return self._arena, at

    def read_one(
        self,
        key: str,
        spec: Any,
        placement: Any = None,
        checks: list[Callable[[], None]] | None = None,
    ) -> Any:
        """Read one array: a host array (``placement=None``) or a ``jax.Array`` placed as asked."""
        dtype, shape, nbytes = spec[0], tuple(spec[1]), spec[2]
        name = f"{key}.npy"
        entry = self.index.entries[name]
        if placement is None and entry.method == 0 and nbytes:
            found = self._read_cached(name, entry, spec)
            if found is not None:
                return found
        reader = _zip.MemberReader(self.fd, entry, self.where, self.index)
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
                checks=checks,
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
            if reader.pieced:  # one read: its pieces are inflated on every core at once
                step = nbytes
            elif reader.check_in_background() and nbytes >= 64 * _READ_CHUNK:
                step = 8 * _READ_CHUNK
            # A member deflated in pieces is inflated on the pool while the next
            # members are read; ``checks`` waits for it before the load returns.
            later = checks if reader.pieced and placement is None else None
            for pos in range(0, nbytes, step):
                reader.readinto(view[pos : pos + step], later)
            arr = buf.view(stored).reshape(shape, order=order)
        reader.finish(checks)
        arr = arr.view(dtype) if stored != dtype else arr
        if placement is not None:
            import jax

            return jax.device_put(arr, placement)
        return arr

    def _read_placed(
        self,
        reader: _zip.MemberReader,
        entry: _zip.Entry,
        *,
        start: int,
        stored: np.dtype,
        dtype: np.dtype,
        shape: tuple[int, ...],
        sharding: Any,
        checks: list[Callable[[], None]] | None,
    ) -> Any:
        import jax

        indices = sharding.addressable_devices_indices_map(shape)
        placed: dict[tuple[tuple[int, int], ...], _Placed] = {}
        for index in indices.values():
            norm = norm_index(index, shape)
            if norm not in placed:
                placed[norm] = _Placed(norm, stored)
        tiles = _row_tiling(list(placed.values()), shape)
        if (entry.method == 0 or reader.pieced) and tiles is not None:
            # Each part is a run of whole rows and together they are the member, in
            # order: read straight into the devices' buffers, the CRC checked as usual
            # (a part's pieces inflated on every core at once).
            reader.check_in_background()
            for part in tiles:
                view = memoryview(part.array.reshape(-1).view(np.uint8))  # pyright: ignore[reportArgumentType]
                if reader.pieced:
                    reader.readinto(view)
                    continue
                for pos in range(0, view.nbytes, _READ_CHUNK):
                    reader.readinto(view[pos : pos + _READ_CHUNK])
            reader.finish(checks)
        else:  # every row through a slab (decompressed once if deflated), sliced on the way
            row = math.prod(shape[1:]) * stored.itemsize
            rows_per = max(1, _SLAB // max(row, 1))
            slab_buf = np.empty(rows_per * row, np.uint8)
            parts = list(placed.values())
            for s0 in range(0, shape[0], rows_per):
                s1 = min(shape[0], s0 + rows_per)
                if not any(_overlaps(part, s0, s1) for part in parts):
                    # No device here needs these rows: a member deflated in pieces
                    # skips the pieces that hold only them (others are read and checked).
                    reader.skip((s1 - s0) * row)
                    continue
                view = memoryview(slab_buf)[: (s1 - s0) * row]  # pyright: ignore[reportArgumentType]
                reader.readinto(view)
                slab = slab_buf[: (s1 - s0) * row].view(stored).reshape((s1 - s0, *shape[1:]))
                _scatter(slab, s0, s1, parts)
            reader.finish()
        arrays = []
        for device, index in indices.items():
            host = placed[norm_index(index, shape)].array
            host = host.view(dtype) if stored != dtype else host
            arrays.append(jax.device_put(host, device))
        return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def _row_tiling(parts: list[_Placed], shape: tuple[int, ...]) -> list[_Placed] | None:
    """``parts`` in row order if each is a run of whole rows and together they are every row
    exactly once, else ``None``."""
    if any(
        (a, b) != (0, n) for p in parts for (a, b), n in zip(p.index[1:], shape[1:], strict=True)
    ):
        return None
    ordered = sorted(parts, key=lambda p: _rows_needed(p.index))
    at = 0
    for part in ordered:
        r0, r1 = _rows_needed(part.index)
        if r0 != at:
            return None
        at = r1
    return ordered if at == shape[0] else None


def _overlaps(part: _Placed, s0: int, s1: int) -> bool:
    a, b = _rows_needed(part.index)
    return max(a, s0) < min(b, s1)


def _drain(reader: _zip.MemberReader, n: int) -> None:
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


def read_member(
    fd: int, entry: _zip.Entry, where: str, index: _zip.ZipIndex | None = None
) -> bytes:
    reader = _zip.MemberReader(fd, entry, where, index)
    data = reader.read(entry.size)
    reader.finish()
    return data


_SMALL_MEMBER = 64 << 10  # a single-device jax.Array up to this size is copied to the host whole


def _is_jax_array(value: Any) -> bool:
    cls = type(value)
    # Looked up on the class: on the instance, the property would build every shard.
    return cls.__module__.startswith(("jax", "jaxlib")) and hasattr(cls, "addressable_shards")


def _shard_bytes(data: Any, stored: np.dtype) -> memoryview:
    """The bytes of a single-device array on a CPU device, viewed in place."""
    # The shard's own Array object is temporary: the host view cached on it
    # by numpy conversion goes away with it, never staying on the user's array.
    host = np.asarray(data)
    host = host.view(stored) if host.dtype != stored else host
    return memoryview(np.ascontiguousarray(host).reshape(-1).view(np.uint8))  # pyright: ignore[reportArgumentType]


def _jax_member(name: str, arr: Any) -> _zip.Member:
    """A ``.npy`` member written from the shards of a ``jax.Array`` (replica 0 of each)."""
    shape = tuple(arr.shape)
    stored = storage_dtype(np.dtype(arr.dtype))
    blocks = _host.blocks_of(name, arr)
    header = build_header(stored, shape, False)
    nbytes = math.prod(shape) * stored.itemsize
    device = _host.streams(arr)
    if nbytes and (device or not _host.row_runs(blocks, shape)):
        # In accelerator memory, or split across columns on CPU devices: copied to the
        # host in bounded pieces, within the host budget.
        return _copied_member(name, header, blocks, shape, stored, device=device)

    def chunks() -> Iterator[_zip.Chunk]:
        yield header
        for _, data in blocks if nbytes else ():
            yield _shard_bytes(data, stored)

    # In place: each shard's own host buffer, in order (runs of whole rows).
    return _zip.Member(name, len(header) + nbytes, chunks, stable=True)


def _copied_member(
    name: str,
    header: bytes,
    blocks: list[_host.Block],
    shape: tuple[int, ...],
    stored: np.dtype,
    *,
    device: bool,
) -> _zip.Member:
    """A ``.npy`` member whose bytes are copied to the host piece by piece as it is written."""

    def chunks() -> Iterator[_zip.Chunk]:
        yield header
        yield from _host.pieces(name, blocks, shape, stored, device=device)

    size = len(header) + math.prod(shape) * stored.itemsize
    # The bytes the in-place path's sample would see: the header, then the array's first.
    sample = lambda: header + _host.sample(name, blocks, shape, stored, device=device)
    # Each region comes in a fresh host array: a deflated member's pieces are views of them.
    return _zip.Member(name, size, chunks, stable=True, once=True, sample=sample)


def _small_jax_member(name: str, arr: Any) -> _zip.Member | None:
    """A small ``jax.Array`` held whole by one device: its bytes, copied now (else ``None``)."""
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
        small = None if _host.FORCE_STREAMING else _small_jax_member(name, arr)
        return small or _jax_member(name, arr)
    arr = np.asarray(arr)
    stored_dtype = storage_dtype(arr.dtype)
    stored = arr.view(stored_dtype) if arr.dtype != stored_dtype else arr
    data, fortran = array_bytes(stored)
    header = build_header(stored.dtype, arr.shape, fortran)
    return _zip.Member.of(name, (header, data))


def members(arrays: Mapping[str, Any]) -> list[_zip.Member]:
    with _process.paused():
        return [_member(key, arr) for key, arr in arrays.items()]
