"""Writing arrays as the ``<key>.npy`` members of an ``arrays.npz`` archive.

A sharded ``jax.Array`` is taken shard by shard (replica 0 of each), never
gathered into one host buffer; a small one held by one device is copied to the
host whole, which costs less than walking its shards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from jaxstruct.registry import SerializationError

from . import _gc, _zip
from ._dtypes import storage_dtype
from ._npy import array_bytes, build_header
from ._npzread import norm_index

__all__ = ["members", "write_npz"]

_SLAB = 8 << 20  # bytes of rows assembled at a time from the shards of a sharded array
_SMALL_MEMBER = 64 << 10  # a single-device jax.Array up to this size is copied to the host whole


def _is_jax_array(value: Any) -> bool:
    cls = type(value)
    # Looked up on the class: on the instance, the property would build every shard.
    return cls.__module__.startswith(("jax", "jaxlib")) and hasattr(cls, "addressable_shards")


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
    blocks = sorted(((norm_index(s.index, shape), s) for s in shards), key=lambda b: b[0])
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


def members(arrays: Mapping[str, Any]) -> list[_zip.Member]:
    with _gc.paused():
        return [_member(key, arr) for key, arr in arrays.items()]


def write_npz(
    handle: Any, arrays: Mapping[str, Any], compression: str, step: Callable[[str], None]
) -> tuple[int, int]:
    return _zip.write_zip(handle, members(arrays), compression=compression, after_member=step)
