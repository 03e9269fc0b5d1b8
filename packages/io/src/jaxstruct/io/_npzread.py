"""Reading the arrays of an ``arrays.npz`` archive, checked, into aligned buffers.

Reading never copies array data it does not have to: a stored member is read
with ``preadv`` straight into a 64-byte-aligned buffer, which ``jax.device_put``
adopts without a copy on the CPU; one array is read at a time, so the peak is
the data itself. With a :class:`jax.sharding.Sharding` placement only the rows
each addressable device needs are read (a deflated member is decompressed once
and sliced on the way).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from jaxstruct.registry import SerializationError

from . import _zipread
from ._crc import crc32
from ._dtypes import storage_dtype
from ._formats import OpenedCheckpoint, aligned_empty
from ._npy import build_header, parse_header, prefix_length

__all__ = ["NpzCheckpoint", "aligned_empty", "norm_index", "read_member"]

_READ_CHUNK = 1 << 20  # bytes read at a time (each piece's CRC computed apart)
_SLAB = 8 << 20  # bytes of rows decompressed or gathered at a time for a sharded read

ArrayTable = Mapping[str, Any]  # key -> ArraySpec(dtype, shape, nbytes)


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
        self.array = np.empty(tuple(b - a for a, b in index), dtype)


def _rows_needed(index: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    return index[0] if index else (0, 1)


class NpzCheckpoint(OpenedCheckpoint):
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
            norm = norm_index(index, shape)
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
            host = placed[norm_index(index, shape)].array
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


def read_member(
    fd: int, entry: _zipread.Entry, where: str, index: _zipread.ZipIndex | None = None
) -> bytes:
    reader = _zipread.MemberReader(fd, entry, where, index)
    data = reader.read(entry.size)
    reader.finish()
    return data
