"""Reading one tensor's bytes straight into its result buffers, shard by shard.

The header gives each tensor's byte range, so a tensor is read with
positioned reads (``os.preadv``) into 64-byte aligned buffers that JAX's CPU
client adopts without a copy: the peak is the result itself. A tensor wanted
with a sharding is read shard by shard, each distinct shard once, and only
its own bytes: a shard is a set of contiguous runs of the C-ordered tensor
(whole rows when the trailing dimensions are not split).

Why not ``safetensors.safe_open(path, framework="numpy")`` (safetensors 0.8.0,
measured on 1 GiB in 64 float32 tensors and on half of a 16 MiB tensor):

* ``get_tensor`` returns arrays over a ``bytearray``, 16-byte aligned: JAX
  copies each into a buffer of its own, and ``jaxstruct.io.load`` (which turns
  the arrays it read into JAX arrays once all are read) then peaks at
  1.72x the data, against 1.00x with these reads;
* ``get_slice(...)[rows]`` reads the whole tensor with ``backend="pread"``
  (16 MiB read and a 3x peak for an 8 MiB slice), and with the default
  ``backend="mmap"`` the mapped pages count in the process's memory besides
  the copy (a 2.25x peak);
* its NumPy side has no float8 dtypes (``F8_E4M3``, ``F8_E5M2``, ``F8_E8M0``
  raise ``AttributeError``: NumPy has no ``float8_e4m3fn``), and it refuses
  no duplicate header key (see ``_header``).
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from jaxstruct.io import ArraySpec, empty_array
from jaxstruct.registry import SerializationError

from ._checksums import Checker

__all__ = ["read_tensor", "result_buffer"]

_MAX_READ = 1 << 30  # one preadv call at most (Linux caps a read near 2 GiB)
_MAPPED_BYTES = 1 << 20  # buffers from this size on are anonymous memory maps
_MAP_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)

_SEGMENT_PIECES = 16  # a whole tensor is read (and checked) 16 checksum pieces at a time

Box = tuple[tuple[int, int], ...]
Check = tuple[Checker, str]  # the load's checker, and the tensor's name


def result_buffer(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-ordered array whose data starts on a 64-byte boundary.

    A small one is :func:`jaxstruct.io.empty_array`'s. A large one is its own
    anonymous memory map (page-aligned): NumPy asks the kernel for transparent
    huge pages for its large arrays, and filling fresh huge pages from a read
    made loads three to five times slower on a busy machine (the kernel
    compacts memory to find each 2 MiB page). The map is populated when it is
    made (``MAP_POPULATE``, where the system has it): the read fills every page
    anyway, and one call backing them all took 0.38 s for 1 GiB where a fault
    per page inside the reads took 0.64 s (``safetensors.flax.load_file`` 0.43
    s; benchmarks/README.md).
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= _MAPPED_BYTES:
        raw = np.frombuffer(mmap.mmap(-1, nbytes, flags=_MAP_FLAGS), np.uint8)
        return raw.view(dtype).reshape(tuple(shape))
    return empty_array(ArraySpec(dtype, tuple(shape), nbytes))


def _pread_into(fd: int, out: np.ndarray, offset: int, where: str) -> None:
    """Fill the contiguous ``out`` with the file's bytes from ``offset`` on."""
    view = out.reshape(-1).view(np.uint8).data
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done : done + _MAX_READ]], offset + done)
        if got <= 0:
            raise SerializationError(f"{where}: the file ended inside a tensor (truncated?)")
        done += got


def _read_checked(fd: int, out: np.ndarray, begin: int, check: Check, where: str) -> None:
    """Fill ``out`` with a whole tensor in segments, each checked on the CRC threads while
    the next one is read."""
    checker, name = check
    view = out.reshape(-1).view(np.uint8)
    segment = _SEGMENT_PIECES * checker.checksums.piece
    for at in range(0, len(view), segment):
        part = view[at : at + segment]
        _pread_into(fd, part, begin + at, where)
        checker.whole(name, at // checker.checksums.piece, part)


def _read_box(
    fd: int,
    begin: int,
    shape: Sequence[int],
    box: Box,
    out: np.ndarray,
    *,
    where: str,
    check: Check | None = None,
    runs: list[tuple[int, memoryview]] | None = None,
) -> None:
    """Read the part ``box`` of the C-ordered tensor at ``begin`` into ``out`` (its shape).

    A whole tensor is checked here (with ``check``); the runs of a part are added to
    ``runs`` (``(offset in the tensor, bytes read)``), for the caller to check together
    with the other parts' runs.
    """
    split = [d for d, (lo, hi) in enumerate(box) if (lo, hi) != (0, shape[d])]
    if not split:
        if check is None:
            _pread_into(fd, out, begin, where)
        else:
            _read_checked(fd, out, begin, check, where)
        return
    last = split[-1]  # dimensions after it are whole: each run is contiguous in the file
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    itemsize = out.dtype.itemsize
    lead = [range(lo, hi) for lo, hi in box[:last]]
    for index in itertools.product(*lead):
        first = sum(i * s for i, s in zip(index, strides, strict=False))
        first += box[last][0] * strides[last]
        target = out[tuple(i - lo for i, (lo, _) in zip(index, box, strict=False))]
        _pread_into(fd, target, begin + first * itemsize, where)
        if runs is not None:
            runs.append((first * itemsize, memoryview(target.reshape(-1).view(np.uint8))))


def read_tensor(
    fd: int,
    begin: int,
    dtype: np.dtype,
    shape: tuple[int, ...],
    placement: Any,
    *,
    where: str,
    check: Check | None = None,
) -> Any:
    """The tensor at byte ``begin`` as NumPy (``placement`` ``None``) or a sharded jax.Array.

    With ``check`` (the checker and the tensor's name), every byte read is checked
    against the file's checksums, on the CRC threads: the caller waits for
    ``checker.finish()`` before it trusts the result.
    """
    if placement is None:
        out = result_buffer(shape, dtype)
        if out.size:
            _read_box(fd, begin, shape, tuple((0, n) for n in shape), out, where=where, check=check)
        return out
    import jax

    devices_of: dict[Box, list[Any]] = {}
    for device, index in placement.addressable_devices_indices_map(shape).items():
        box = tuple(
            (s.start or 0, n if s.stop is None else s.stop)
            for s, n in zip(index, shape, strict=True)
        )
        devices_of.setdefault(box, []).append(device)
    pieces = []
    # The runs of every shard, checked together: a piece that several shards cut is
    # completed from the others' bytes, and read from the file only where no shard of
    # this process reads it.
    runs: list[tuple[int, memoryview]] = []
    for box, devices in devices_of.items():
        host = result_buffer([hi - lo for lo, hi in box], dtype)
        if host.size:
            _read_box(fd, begin, shape, box, host, where=where, check=check, runs=runs)
        for device in devices:
            where_to = jax.sharding.SingleDeviceSharding(device, memory_kind=placement.memory_kind)
            pieces.append(jax.device_put(host, where_to))
    if check is not None and runs:
        checker, name = check
        runs.sort(key=lambda run: run[0])
        checker.runs(fd, name, begin, math.prod(shape) * dtype.itemsize, runs)
    return jax.make_array_from_single_device_arrays(shape, placement, pieces)
