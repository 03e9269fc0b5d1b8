"""Reading one stored array straight into the shards of a ``jax.Array``.

Orbax reads every target shard on its own: when the target is sharded
differently from the stored chunks (resharding), each stored chunk is
decoded once per shard it overlaps, and each shard is read into a fresh
host buffer that JAX then copies, because it is not aligned as JAX wants.

Here the stored array is read once, unit by unit where the checkpoint records
its units' CRC-32s (``_units``; each unit is one stored chunk, read whole and
checked before it reaches a shard: :func:`_fill_units`), else in blocks of
whole stored chunks; each unit or block is copied into the host buffers of
the shards it overlaps. Those
buffers are 64-byte aligned, so on CPU devices JAX adopts them without a
copy: the peak is the result plus the blocks in flight. Each process reads
only the blocks its own devices need. How blocks are read (:class:`Pace`):

* local files: blocks of ``BLOCK_BYTES``, two in flight, and tensorstore's
  chunk cache shared by the shards that read one block;
* object stores: blocks of :func:`block_bytes` (1/128 of what is read,
  within 2 and 32 MiB; the format saves chunks of that size there), eight
  in flight, no chunk cache: a block that feeds several shards is read once
  and copied. Tensorstore holds each response while it decodes it, so the
  blocks in flight cost about 1/16 of the data (a 256 MiB restore from S3
  peaked at 1.06-1.09x the data).
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from jaxstruct.io import ArraySpec, empty_array

from ._units import Units, bytes_crc

__all__ = [
    "BLOCK_BYTES",
    "IN_FLIGHT",
    "STORE_BLOCK_BYTES",
    "STORE_IN_FLIGHT",
    "ChecksumMismatch",
    "Job",
    "Pace",
    "block_bytes",
    "read_into_host",
    "read_into_shards",
]

#: Largest block read at once from local files (rounded to whole stored chunks). With
#: 4 MiB chunks (``_format.CHUNK_BYTES``), 16 MiB blocks kept a resharded restore of 1 GiB
#: at 1.09-1.12x the data, where 32 MiB ones peaked at 1.17-1.24x.
BLOCK_BYTES = 16 << 20
#: Largest block (and stored chunk) in object stores.
STORE_BLOCK_BYTES = 32 << 20
#: Smallest block from an object store, however little is read.
MIN_BLOCK_BYTES = 2 << 20
#: Blocks being read at once from local files.
IN_FLIGHT = 2
#: Blocks being read at once from object stores, where each request waits on the network.
STORE_IN_FLIGHT = 8


def block_bytes(total: int) -> int:
    """The block (and stored chunk) size in object stores for ``total`` bytes: 1/128 of
    them, within 2 MiB and ``STORE_BLOCK_BYTES``.

    ``STORE_IN_FLIGHT`` blocks in flight then hold 1/16 of the data at most.
    """
    return min(STORE_BLOCK_BYTES, max(MIN_BLOCK_BYTES, total // 128))


class Pace(NamedTuple):
    """How a read goes: block size in bytes, blocks in flight, and whether tensorstore's
    chunk cache (:attr:`cache`) lets the shards reading one block share it."""

    block: int
    in_flight: int = IN_FLIGHT
    cached: bool = True

    @classmethod
    def of(cls, total: int, *, remote: bool) -> Pace:
        """The pace for reading ``total`` bytes from an object store or local files."""
        if remote:
            return cls(block_bytes(total), STORE_IN_FLIGHT, cached=False)
        return cls(BLOCK_BYTES)

    @property
    def cache(self) -> int:
        """Bytes of tensorstore's chunk cache: the blocks in flight and one more (0: none)."""
        return (self.in_flight + 1) * self.block if self.cached else 0


Box = tuple[tuple[int, int], ...]  # (start, stop) per dimension


def _buffer(box: Box, dtype: np.dtype) -> np.ndarray:
    """The 64-byte aligned host buffer of one shard (JAX's CPU client adopts it as it is)."""
    shape = tuple(hi - lo for lo, hi in box)
    return empty_array(ArraySpec(dtype, shape, math.prod(shape) * dtype.itemsize))


def _box(index: tuple[slice, ...], shape: Sequence[int]) -> Box:
    return tuple(
        (s.start or 0, n if s.stop is None else s.stop) for s, n in zip(index, shape, strict=True)
    )


def _intersect(a: Box, b: Box) -> Box | None:
    out = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b, strict=True))
    return out if all(lo < hi for lo, hi in out) else None


def _block_shape(
    shape: Sequence[int], chunk: Sequence[int], itemsize: int, limit: int
) -> list[int]:
    """Whole chunks per block: grow along the leading dimensions within ``limit`` bytes."""
    block = [max(1, min(c, n)) for c, n in zip(chunk, shape, strict=True)]
    for dim in range(len(block)):
        other = math.prod(block[:dim] + block[dim + 1 :]) * itemsize
        fits = max(1, limit // max(1, other * block[dim]))
        block[dim] = min(shape[dim], block[dim] * fits)
        if fits == 1:
            break
    return block


def _blocks(shape: Sequence[int], block: Sequence[int], wanted: Box) -> Iterator[Box]:
    """The blocks of the grid that overlap ``wanted``, clipped to the array."""
    ranges = [range(lo // b * b, hi, b) for (lo, hi), b in zip(wanted, block, strict=True)]
    for starts in itertools.product(*ranges):
        yield tuple((s, min(s + b, n)) for s, b, n in zip(starts, block, shape, strict=True))


class Job(NamedTuple):
    """One array to read: an open tensorstore, its shape, the target sharding.

    ``view`` reinterprets the read bytes before they reach the devices (stored
    ``uint8`` read back as ``bool``), or is ``None``. ``units``: the array's stored
    units and their CRC-32s (``_units``), each read whole and checked; ``None`` for a
    checkpoint without them (read in blocks, as tensorstore's chunk codecs check it).
    ``sharding`` ``None``: one host NumPy array (:func:`read_into_host`).
    """

    store: Any
    shape: tuple[int, ...]
    sharding: Any
    view: np.dtype | None = None
    units: Units | None = None


def read_into_shards(jobs: Mapping[str, Job], pace: Pace) -> dict[str, Any]:
    """Read every job's array as a ``jax.Array`` with its sharding.

    Blocks of all the arrays go through one pipeline, so many small arrays
    are read concurrently, at ``pace``.
    Raises whatever tensorstore raises for missing or corrupt data.
    """
    import jax

    plans = {key: _Plan(job) for key, job in jobs.items()}
    _fill(plans, pace)
    out: dict[str, Any] = {}
    for key, plan in plans.items():
        for box in list(plan.buffers):  # shards no block fed (none, unless the array is empty)
            plan.place(box)
        arrays = [piece for box in plan.devices_of for piece in plan.placed[box]]
        out[key] = jax.make_array_from_single_device_arrays(
            plan.job.shape, plan.job.sharding, arrays
        )
    return out


def read_into_host(jobs: Mapping[str, Job], pace: Pace) -> dict[str, np.ndarray]:
    """Read every job's array (``sharding`` ``None``) as one 64-byte aligned NumPy array."""
    plans = {key: _Plan(job) for key, job in jobs.items()}
    _fill(plans, pace)
    out = {}
    for key, plan in plans.items():
        for box in list(plan.buffers):  # an empty array: no block fed it
            plan.place(box)
        ((host,),) = plan.placed.values()
        out[key] = host
    return out


class _Plan:
    """The host buffers of one array's distinct shards, and which devices take each."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.dtype = np.dtype(job.store.dtype.numpy_dtype)
        self.devices_of: dict[Box, list[Any]] = collections.defaultdict(list)
        if job.sharding is None:  # one host array
            self.devices_of[tuple((0, n) for n in job.shape)] = []
        else:
            for device, index in job.sharding.addressable_devices_indices_map(job.shape).items():
                self.devices_of[_box(index, job.shape)].append(device)
        self.buffers = {box: _buffer(box, self.dtype) for box in self.devices_of}
        self.placed: dict[Box, list[Any]] = {}  # each shard's arrays, once on its devices
        self.waiting: dict[Box, int] = {}  # blocks each shard still waits for (set by _fill)

    def place(self, box: Box) -> None:
        """Hand the filled host buffer of shard ``box`` to its devices, and let it go.

        On an accelerator this copies it to device memory: a shard's host buffer
        lives from its first block to its last, never until the whole restore
        ends (on CPU devices, JAX adopts the aligned buffer as it is).
        """
        import jax

        host = self.buffers.pop(box)
        if self.job.view is not None:
            host = host.view(self.job.view)
        if self.job.sharding is None:
            self.placed[box] = [host]
            return
        memory_kind = self.job.sharding.memory_kind
        self.placed[box] = [
            jax.device_put(host, jax.sharding.SingleDeviceSharding(device, memory_kind=memory_kind))
            for device in self.devices_of[box]
        ]

    def done(self, parts: Sequence[tuple[Box, Box]]) -> None:
        """Blocks feeding ``parts`` are written: place each shard that waits for no more."""
        for box, _ in parts:
            self.waiting[box] -= 1
            if not self.waiting[box]:
                self.place(box)

    def reads(self, limit: int) -> Iterator[tuple[Box, list[tuple[Box, Box]]]]:
        """``(region to read, [(shard, part of the region for that shard)])`` per block."""
        shape = self.job.shape
        if not self.buffers or not math.prod(shape):
            return
        chunk = list(self.job.store.chunk_layout.read_chunk.shape or shape)
        block = _block_shape(shape, chunk, self.dtype.itemsize, limit)
        wanted = tuple(
            (min(b[d][0] for b in self.buffers), max(b[d][1] for b in self.buffers))
            for d in range(len(shape))
        )
        for block_box in _blocks(shape, block, wanted):
            parts = [
                (box, cut)
                for box in self.buffers
                if (cut := _intersect(block_box, box)) is not None
            ]
            if parts:  # read only the part of the block some shard needs
                need = tuple(
                    (min(c[d][0] for _, c in parts), max(c[d][1] for _, c in parts))
                    for d in range(len(shape))
                )
                yield need, parts


def _fill(plans: Mapping[str, _Plan], pace: Pace) -> None:
    """Read every block, at most ``pace.in_flight`` blocks' worth of bytes at a time.

    A stored chunk larger than the block size is a block of its own, and two
    of them may be in flight: reading them one by one (the least memory) made
    a 256 MiB restore from S3 up to 1.5x slower than orbax's.

    A block feeding one shard only, or (with the chunk cache) one within the
    block size, is written by tensorstore straight into each shard's buffer:
    the shards' reads of one block share its decoded chunks in the cache. Any
    other block is read once into its own array, then copied into the shards.
    """
    import tensorstore as ts

    if any(plan.job.units is not None for plan in plans.values()):
        _fill_units(plans, pace)
        return
    limit = pace.block
    pending: collections.deque[_Pending] = collections.deque()
    in_flight = 0
    reads = {key: list(plan.reads(limit)) for key, plan in plans.items()}
    for key, plan in plans.items():
        plan.waiting = collections.Counter(box for _, parts in reads[key] for box, _ in parts)
    for key, plan in plans.items():
        for need, parts in reads[key]:
            nbytes = math.prod(hi - lo for lo, hi in need) * plan.dtype.itemsize
            while pending and in_flight + nbytes > max(pace.in_flight * limit, 2 * nbytes):
                in_flight -= pending.popleft().finish()
            if len(parts) == 1 or (pace.cached and nbytes <= limit):
                writes = [
                    ts.array(plan.buffers[box])[_within(cut, box)].write(
                        plan.job.store[_within(cut, None)]
                    )
                    for box, cut in parts
                ]
                pending.append(_Pending(nbytes, writes, plan=plan, parts=parts))
            else:
                read = plan.job.store[_within(need, None)].read()
                pending.append(_Pending(nbytes, [], read, plan, need, parts))
            in_flight += nbytes
    while pending:
        pending.popleft().finish()


def _within(cut: Box, box: Box | None) -> tuple[slice, ...]:
    """``cut`` as slices relative to the origin of ``box`` (``None``: the array's)."""
    if box is None:
        return tuple(slice(lo, hi) for lo, hi in cut)
    return tuple(slice(lo - b0, hi - b0) for (lo, hi), (b0, _) in zip(cut, box, strict=True))


class _Pending(NamedTuple):
    """A block being read: tensorstore's writes into the shards, or one read to copy out."""

    nbytes: int
    writes: list[Any]
    read: Any = None
    plan: _Plan | None = None
    need: Box = ()
    parts: Sequence[tuple[Box, Box]] = ()

    def finish(self) -> int:
        for write in self.writes:
            write.result()
        if self.read is not None and self.plan is not None:
            data = self.read.result()
            for box, cut in self.parts:
                self.plan.buffers[box][_within(cut, box)] = data[_within(cut, self.need)]
        if self.plan is not None:
            self.plan.done(self.parts)
        return self.nbytes


#: Private switch for measurements: ``False`` reads unit by unit as usual but skips the check.
_CHECK = True


class ChecksumMismatch(Exception):  # turned into our SerializationError by _format
    """A unit read does not match its recorded CRC-32, or the units leave part of an array
    uncovered; ``key`` names the array, ``box`` the unit (``None``: not covered)."""

    def __init__(self, key: str, box: Box | None) -> None:
        super().__init__(key, box)
        self.key, self.box = key, box


def _volume(box: Box) -> int:
    return math.prod(hi - lo for lo, hi in box)


def _unit_reads(key: str, plan: _Plan) -> list[tuple[Box, int, list[tuple[Box, Box]]]]:
    """``(unit, its CRC-32, [(shard, part of the unit for that shard)])`` per unit a shard
    needs; every shard must be covered exactly by the units, each inside the array."""
    units = plan.job.units or []
    shape = plan.job.shape
    covered = dict.fromkeys(plan.buffers, 0)
    out = []
    for unit, crc in units:
        if len(unit) != len(shape) or any(hi > n for (_, hi), n in zip(unit, shape, strict=True)):
            raise ChecksumMismatch(key, None)
        parts = [(box, c) for box in plan.buffers if (c := _intersect(unit, box)) is not None]
        for box, c in parts:
            covered[box] += _volume(c)
        if parts:
            out.append((unit, crc, parts))
    if any(n != _volume(box) for box, n in covered.items()):
        raise ChecksumMismatch(key, None)
    return out


def _fill_units(plans: Mapping[str, _Plan], pace: Pace) -> None:
    """Read every unit some shard needs, whole, at most ``pace.in_flight`` blocks' worth of
    bytes at a time; check its CRC-32, then let it reach the shards.

    A unit lying in one shard, where it is a contiguous range of the shard's buffer
    (a restore into the stored shards, or as NumPy), is written there by tensorstore and
    checked in place; any other unit is written into a buffer of its own (reused from
    unit to unit: fresh memory costs a page fault per page), checked, and copied out.
    Each unit's CRC-32 is computed by the tensorstore thread that completes its read, as
    soon as it completes (:class:`_Unit`): while the other units are still being read,
    and never on the thread that copies the units out and hands the shards to JAX.
    """
    import tensorstore as ts

    limit = pace.block
    pending: collections.deque[_Unit] = collections.deque()
    spare = _Spare()
    in_flight = 0
    reads = {key: _unit_reads(key, plan) for key, plan in plans.items()}
    for key, plan in plans.items():
        plan.waiting = collections.Counter(box for _, _, parts in reads[key] for box, _ in parts)
    for key, plan in plans.items():
        for unit, crc, parts in reads[key]:
            nbytes = _volume(unit) * plan.dtype.itemsize
            while pending and in_flight + nbytes > max(pace.in_flight * limit, 2 * nbytes):
                in_flight -= pending.popleft().finish(spare)
            source = plan.job.store[_within(unit, None)]
            ((box, part),) = parts if len(parts) == 1 else ((None, None),)
            # (with the Ellipsis, a view even of a 0-d buffer, never a copied scalar)
            view = None if box is None else plan.buffers[box][(*_within(unit, box), ...)]
            if box is not None and part == unit and view is not None and view.flags.c_contiguous:
                into, data = plan.buffers[box], view
                future = ts.array(into)[_within(unit, box)].write(source)
                item = _Unit(key, plan, unit, crc, parts, data=data, future=future, copy_out=False)
            else:
                data = spare.take(tuple(hi - lo for lo, hi in unit), plan.dtype)
                future = ts.array(data).write(source)
                item = _Unit(key, plan, unit, crc, parts, data=data, future=future, copy_out=True)
            future.add_done_callback(item.check)
            pending.append(item)
            in_flight += nbytes
    while pending:
        pending.popleft().finish(spare)


class _Spare:
    """Buffers of units read and copied out, for the next units (at most ``keep`` of them,
    the units a read has in flight with 4 MiB units)."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self.free: list[np.ndarray] = []  # raw bytes

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised C-ordered array of ``shape`` and ``dtype``."""
        nbytes = math.prod(shape) * dtype.itemsize
        found = next((i for i, raw in enumerate(self.free) if raw.nbytes >= nbytes), None)
        raw = np.empty(nbytes, np.uint8) if found is None else self.free.pop(found)
        return raw[:nbytes].view(dtype).reshape(shape)

    def give(self, array: np.ndarray) -> None:
        """``array`` (from :meth:`take`) is free again."""
        raw = array.base if isinstance(array.base, np.ndarray) else None
        while raw is not None and isinstance(raw.base, np.ndarray):
            raw = raw.base  # the raw buffer under the views
        if raw is not None and len(self.free) < self.keep:
            self.free.append(raw)


class _Unit:
    """A unit being read into ``data`` (a view of its shard's buffer, or a buffer of its own
    to copy out), and its check.

    :meth:`check` runs as the read's completion callback, on the tensorstore thread that
    completes it (or at once, on this thread, if it is complete already); the CRC-32
    itself releases the GIL. :meth:`finish` waits for both.
    """

    def __init__(
        self,
        key: str,
        plan: _Plan,
        unit: Box,
        crc: int,
        parts: Sequence[tuple[Box, Box]],
        *,
        data: np.ndarray,
        future: Any,
        copy_out: bool,
    ) -> None:
        self.key, self.plan, self.unit, self.crc, self.parts = key, plan, unit, crc, parts
        self.data, self.future, self.copy_out = data, future, copy_out
        self.nbytes = data.nbytes
        self.checked = threading.Event()
        self.matches = True
        self.failure: BaseException | None = None

    def check(self, future: Any) -> None:
        """Compare the unit's CRC-32 with the recorded one, once its bytes are in."""
        try:
            if _CHECK and future.exception() is None:
                self.matches = bytes_crc(self.data) == self.crc
        except BaseException as err:  # raised by finish, on the thread that placed the read
            self.failure = err
        finally:
            self.checked.set()

    def finish(self, spare: _Spare) -> int:
        """Wait for the read and its check; then let the unit reach its shards."""
        self.future.result()
        self.checked.wait()
        if self.failure is not None:
            raise self.failure
        if not self.matches:
            raise ChecksumMismatch(self.key, self.unit)
        if self.copy_out:
            for box, cut in self.parts:
                self.plan.buffers[box][_within(cut, box)] = self.data[_within(cut, self.unit)]
            spare.give(self.data)
        self.plan.done(self.parts)
        return self.nbytes
