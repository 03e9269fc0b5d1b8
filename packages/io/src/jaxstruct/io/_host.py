"""Device arrays to host bytes in bounded pieces, copied ahead of use within a host budget.

An array in accelerator memory is never copied to the host whole: its bytes, in
C order, are cut into *regions* (runs of rows, or smaller runs inside one row),
each region is sliced from the shards that hold it on their devices and copied
to the host asynchronously, several regions ahead of the writer, as long as the
host memory they take stays within the budget (``JAXSTRUCT_HOST_BUDGET``,
256 MiB by default). The writer gets each region's bytes in turn; a region's
host memory is released when the writer asks for the next one.

Every copy goes through a fresh device array (a slice, or a new handle on the
same buffer): JAX caches the host copy of an array on the array object itself,
and on a user's array (or on the shards a sharded array keeps) that cache would
hold the whole model in host memory until the array is deleted.

Arrays that already lie in host memory (JAX's CPU backend, where ``np.asarray``
is a view) are not streamed: the caller keeps its zero-copy path for them.
"""

from __future__ import annotations

import collections
import functools
import math
import threading
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
from jaxstruct.registry import SerializationError

from . import _budget
from ._budget import Ticket

# Regions in flight at most: the budget is cut into this many regions' worth.
_DEPTH = 8
_SAMPLE_BYTES = 3 * 8 * 1024  # what a compression choice looks at (as ``_zip`` samples)

#: Tests: stream arrays that already lie in host memory too (CPU devices).
FORCE_STREAMING = False

T = TypeVar("T")
Block = tuple[tuple[tuple[int, int], ...], Any]  # (start, stop) per dim, single-device array
Region = tuple[tuple[int, int], ...]


def streams(arr: Any) -> bool:
    """Whether the ``jax.Array`` ``arr`` is copied to the host in pieces (it lies in
    accelerator memory) rather than viewed in place."""
    if FORCE_STREAMING:
        return True
    return any(device.platform != "cpu" for device in arr.sharding.device_set)


def _regions(shape: tuple[int, ...], itemsize: int, piece: int) -> Iterator[Region]:
    """Cut an array of ``shape`` into C-order regions of at most ``piece`` bytes each
    (unless one element is larger): leading dims fixed, a range along the next, the rest whole."""
    if not shape:
        yield ()
        return

    def walk(prefix: tuple[tuple[int, int], ...]) -> Iterator[Region]:
        k = len(prefix)
        rest = shape[k + 1 :]
        unit = math.prod(rest) * itemsize  # bytes of one step along dim k
        n = shape[k]
        if unit <= piece or not rest:
            step = n if unit * n <= piece else max(1, piece // max(unit, 1))
            whole = tuple((0, m) for m in rest)
            for a in range(0, n, max(step, 1)):
                yield (*prefix, (a, min(n, a + step)), *whole)
        else:
            for i in range(n):
                yield from walk((*prefix, (i, i + 1)))

    yield from walk(())


def _fresh(data: Any, local: Region) -> Any:
    """A new device array holding ``data[local]`` (never ``data`` itself, whose host
    cache would outlive the export), its copy to the host started."""
    import jax

    if all(a == 0 and b == n for (a, b), n in zip(local, data.shape, strict=True)):
        # The whole shard: a new handle on the same device buffer, no device copy.
        out = jax.make_array_from_single_device_arrays(data.shape, data.sharding, [data])
    else:
        sizes = tuple(b - a for a, b in local)
        out = _slicer(sizes)(data, *(np.int32(a) for a, _ in local))
    if out is data:  # pragma: no cover - a JAX that returns its operand unchanged
        out = jax.make_array_from_single_device_arrays(data.shape, data.sharding, [data])
    out.copy_to_host_async()
    return out


@functools.lru_cache(maxsize=256)
def _slicer(sizes: tuple[int, ...]) -> Callable[..., Any]:
    """A compiled slice of ``sizes`` at starts given as arguments: regions of one size
    share one executable (``jax.lax.slice`` compiles one per start, 2.4 ms each here
    against 0.66 ms a region this way, and keeps them all)."""
    import jax

    return jax.jit(lambda data, *starts: jax.lax.dynamic_slice(data, starts, sizes))


#: The device-side step of a copy (tests replace it to fail in the middle).
copy_start: Callable[[Any, Region], Any] = _fresh


class _Started:
    """One region whose copies to the host are under way: its cost counts in its stream's
    ticket until every object holding its memory is gone (or it is settled at once)."""

    def __init__(
        self, region: Region, parts: list[tuple[Region, Any]], cost: int, ticket: Ticket
    ) -> None:
        self.region = region
        self.parts = parts  # (place inside the region, device array being copied)
        self.cost = cost
        self.ticket = ticket
        self.alive = 0
        self.settled = False
        self.lock = threading.Lock()
        ticket.add(cost)

    def watch(self, obj: T) -> T:
        """Count the region's cost until ``obj`` is gone too."""
        with self.lock:
            self.alive += 1
        weakref.finalize(obj, self._gone)
        return obj

    def _gone(self) -> None:
        with self.lock:
            self.alive -= 1
            if self.alive:
                return
        self.settle()

    def settle(self) -> None:
        """Give the region's cost back (once)."""
        with self.lock:
            if self.settled:
                return
            self.settled = True
        self.ticket.free(self.cost)


def _overlaps(region: Region, blocks: Sequence[Block]) -> list[tuple[Region, Region, Any]]:
    """``(place in region, place in shard, shard)`` for each shard holding part of ``region``."""
    found = []
    for index, data in blocks:
        inter = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(region, index, strict=True)]
        if all(lo < hi for lo, hi in inter):
            dest = tuple((lo - a, hi - a) for (lo, hi), (a, _) in zip(inter, region, strict=True))
            local = tuple((lo - c, hi - c) for (lo, hi), (c, _) in zip(inter, index, strict=True))
            found.append((dest, local, data))
    return found


def _host_slice(data: Any, local: Region) -> np.ndarray:
    """``data[local]`` copied into a new host array (``data`` lies in host memory already)."""
    return np.ascontiguousarray(np.asarray(data)[tuple(slice(a, b) for a, b in local)])


def pieces(
    name: str,
    blocks: Sequence[Block],
    shape: tuple[int, ...],
    stored: np.dtype,
    *,
    piece: int | None = None,
    ahead: int = _DEPTH,
    device: bool = True,
) -> Generator[memoryview, None, None]:
    """Yield the bytes of the array made of ``blocks`` (which tile ``shape`` exactly once)
    in C order, as host memory views, each counted against the host budget until it
    and every view of it are gone.

    The stream takes a ticket of the budget when it starts (a part of this
    thread's ticket when it works within one: an export's writer, a plugin's
    ``reserve_host``), runs copies ahead of the consumer within it, regions of
    about ``piece`` bytes at most (default: an eighth of the ticket), ``ahead`` of
    them at most, and gives it back when it has ended and its regions are freed.
    The consumer may keep the view it got while it asks for the next one.
    ``device``: the blocks lie in accelerator memory (copied through fresh device
    arrays); else in host memory (CPU devices: copied with NumPy).

    Raises:
        SerializationError: a copy from a device failed (named with the array), or
            the enclosing ticket has no room for the stream.
    """
    itemsize = stored.itemsize
    nbytes = math.prod(shape) * itemsize
    if nbytes == 0 and shape:
        return
    # A region joined from several shards costs twice its bytes while it is joined.
    want = 2 * max(nbytes, itemsize)
    if piece is not None:
        want = min(want, (ahead + 1) * 2 * max(piece, itemsize))
    # At least a quarter of the budget where it is free (never waiting inside a ticket).
    ticket = _budget.take(want, min(want, _budget.host_budget() // 4))
    try:
        room = ticket.size
        if room < min(want, 4 * itemsize):  # not the region held and the next
            raise SerializationError(
                f"array {name!r}: no room left for its copy to host memory in this thread's "
                f"reservation ({room} bytes free of {_budget.BUDGET_ENV}); reserve more in "
                "the enclosing jaxstruct.io.reserve_host block, or stream it outside"
            )
        if piece is None:
            piece = room // _DEPTH
            if 2 * nbytes <= room:
                piece = nbytes  # small: one region, one copy per shard
        else:  # room for the region the consumer holds and the next, at least
            piece = min(piece, room // 4)
        piece = max(piece, itemsize)
        yield from _stream(
            name, blocks, shape, stored, ticket=ticket, piece=piece, ahead=ahead, device=device
        )
    finally:
        ticket.end()


def _stream(
    name: str,
    blocks: Sequence[Block],
    shape: tuple[int, ...],
    stored: np.dtype,
    *,
    ticket: Ticket,
    piece: int,
    ahead: int,
    device: bool,
) -> Generator[memoryview, None, None]:
    itemsize = stored.itemsize
    todo = _regions(shape, itemsize, piece)
    following = next(todo, None)
    start = copy_start if device else _host_slice
    pending: collections.deque[_Started] = collections.deque()
    try:
        while following is not None or pending:
            # Start copies ahead while the ticket has room: the regions ahead and the one
            # the consumer still holds fit in it (a region costs at most a quarter of it).
            while following is not None and len(pending) < ahead:
                found, cost = _plan(following, blocks, itemsize)
                if pending and cost > ticket.room:
                    break
                job = _Started(following, [], cost, ticket)
                try:
                    for dest, local, data in found:
                        job.parts.append((dest, job.watch(start(data, local))))
                except Exception as err:
                    job.settle()
                    raise _failed(name, found, err) from err
                pending.append(job)
                following = next(todo, None)
            job = pending.popleft()
            try:
                out = _landed(name, job, stored)
            except BaseException:
                job.settle()
                raise
            # Its memory counts until the consumer lets go of it (not when it asks for the
            # next region: a for loop still holds the last one it got) and its copies
            # are gone.
            out = job.watch(out.reshape(-1).view(np.uint8))  # every view of it keeps it
            job.parts = []
            del job
            # numpy's stubs do not declare __buffer__ yet.
            yield memoryview(out)  # pyright: ignore[reportArgumentType]
            del out
    finally:
        for job in pending:  # copies started, never waited for: their memory goes now
            job.settle()
        pending.clear()


def _plan(
    region: Region, blocks: Sequence[Block], itemsize: int
) -> tuple[list[tuple[Region, Region, Any]], int]:
    """The shards holding parts of ``region``, and the host bytes it takes while in flight:
    its parts, and the slab joining them when there are several."""
    found = _overlaps(region, blocks)
    nbytes = math.prod(b - a for a, b in region) * itemsize
    single = len(found) == 1 and all(
        (a, b) == (0, hi - lo) for (a, b), (lo, hi) in zip(found[0][0], region, strict=True)
    )
    return found, nbytes if single else 2 * nbytes


def _landed(name: str, job: _Started, stored: np.dtype) -> np.ndarray:
    """Wait for ``job``'s copies and return the region's bytes (joined if several shards)."""
    try:
        hosts = [(dest, np.asarray(data)) for dest, data in job.parts]
    except Exception as err:
        raise _failed(name, [(d, d, data) for d, data in job.parts], err) from err
    job.parts = []
    shape = tuple(b - a for a, b in job.region)
    if len(hosts) == 1 and hosts[0][1].shape == shape:
        host = hosts[0][1]
        return np.ascontiguousarray(host.view(stored) if host.dtype != stored else host)
    out = np.empty(shape, stored)
    for dest, host in hosts:
        view = host.view(stored) if host.dtype != stored else host
        out[tuple(slice(a, b) for a, b in dest)] = view
    return out


def _failed(name: str, found: Sequence[tuple[Any, Any, Any]], err: Exception) -> SerializationError:
    devices = sorted({str(getattr(data, "device", "?")) for _, _, data in found})
    return SerializationError(
        f"array {name!r}: copying it from {', '.join(devices) or 'its device'} to host memory "
        f"failed ({type(err).__name__}: {err}); nothing was replaced. Check the device's "
        "health and memory, then export again"
    )


def fresh_copies(what: str, datas: Sequence[Any]) -> list[np.ndarray]:
    """Whole host copies of the single-device arrays ``datas``, each made through a fresh
    device array (none is left cached on ``datas``), all started before any is waited for.

    For callers that keep the copies (a snapshot, a file format written whole): the
    budget bounds streams only, so what these copies take is the caller's to hold.

    Raises:
        SerializationError: a copy from a device failed (named with ``what``).
    """
    started: list[Any] = []
    try:
        for data in datas:
            started.append(copy_start(data, tuple((0, n) for n in data.shape)))
        return [np.asarray(out) for out in started]
    except Exception as err:
        devices = sorted({str(getattr(data, "device", "?")) for data in datas})
        raise SerializationError(
            f"{what}: copying it from {', '.join(devices) or 'its device'} to host memory "
            f"failed ({type(err).__name__}: {err}). Check the device's health and memory, "
            "then try again"
        ) from err


def sample(
    name: str,
    blocks: Sequence[Block],
    shape: tuple[int, ...],
    stored: np.dtype,
    *,
    device: bool = True,
) -> bytes:
    """The first bytes of the array (a few KiB), copied alone, for choosing a compression."""
    out = bytearray()
    stream = pieces(name, blocks, shape, stored, piece=_SAMPLE_BYTES, ahead=1, device=device)
    try:
        for view in stream:
            out += view[: _SAMPLE_BYTES - len(out)]
            if len(out) >= _SAMPLE_BYTES:
                break
    finally:
        stream.close()
    return bytes(out)


def _norm(index: tuple[Any, ...], shape: tuple[int, ...]) -> Region:
    """A shard's index (slices) as ``(start, stop)`` per dimension."""
    out = [sl.indices(n)[:2] for sl, n in zip(index, shape, strict=False)]
    out += [(0, n) for n in shape[len(out) :]]
    return tuple(out)


def blocks_of(name: str, arr: Any) -> list[Block]:
    """The distinct blocks of the ``jax.Array`` ``arr`` this process holds (replica 0 of
    each), in C order of their starts, each ``(box, single-device array)``.

    Raises:
        SerializationError: the process does not hold all of ``arr``.
    """
    shape = tuple(arr.shape)
    if not arr.is_fully_addressable and not arr.is_fully_replicated:
        raise SerializationError(
            f"array {name!r} is sharded across processes and this process does not hold all "
            'of it; the built-in formats write from one process: export with format="orbax"'
        )
    shards = [s for s in arr.addressable_shards if s.replica_id == 0]
    if arr.is_fully_replicated or len(shards) == 1:
        shards = shards[:1]
    blocks = sorted(((_norm(s.index, shape), s.data) for s in shards), key=lambda b: b[0])
    covered = sum(math.prod(b - a for a, b in box) for box, _ in blocks)
    if covered != math.prod(shape):
        raise SerializationError(
            f"array {name!r}: its addressable shards do not cover it exactly once; "
            'export with format="orbax"'
        )
    return blocks


def row_runs(blocks: Sequence[Block], shape: tuple[int, ...]) -> bool:
    """Whether ``blocks`` (in order) are runs of whole rows, one after the other: their
    bytes, each block's in turn, are the array's in C order."""
    if len(blocks) == 1 or not shape:
        return True
    return all(box[1:] == tuple((0, n) for n in shape[1:]) for box, _ in blocks)


def host_chunks(arr: Any, *, chunk_bytes: int | None = None) -> Iterator[memoryview]:
    """Yield the bytes of ``arr`` in C order as host memory, within the process's host budget.

    For a plugin that checksums, compresses or writes an array's bytes in order
    without holding it whole in host memory. Arrays already in host memory in C
    order (NumPy arrays, ``jax.Array`` shards on CPU devices split by rows) are
    viewed in place, no copy. Otherwise each piece is copied (from an accelerator
    through a fresh device array, never through your array, whose cached host copy
    would outlive the export), several pieces ahead, all of it counted against
    ``JAXSTRUCT_HOST_BUDGET`` with every other export and plugin of the process,
    waiting while others hold the budget (inside :func:`reserve_host`, the pieces
    come from that reservation instead). A piece's memory counts until you let go
    of it: keep the one you got while you ask for the next at most, and none once
    the loop ends. Copied pieces are fresh arrays, so a view stays valid while you
    hold it.

    Args:
        arr: a NumPy array or a ``jax.Array`` whose shards this process holds.
        chunk_bytes: the most bytes per piece (default: whole blocks in place, and
            an eighth of the budget's share for copies).

    Raises:
        SerializationError: a copy from a device failed, or the process does not
            hold all of ``arr``.

    Example:
        >>> import numpy as np
        >>> import jaxstruct.io as jio
        >>> from zlib_ng.zlib_ng import crc32
        >>> weights = np.arange(1 << 16, dtype=np.float32)
        >>> crc = 0
        >>> for piece in jio.host_chunks(weights, chunk_bytes=1 << 16):
        ...     crc = crc32(piece, crc)
        >>> crc == crc32(weights.tobytes())
        True
    """
    if isinstance(arr, np.ndarray):
        if arr.flags.c_contiguous or arr.size == 0:
            yield from _slices(np.ascontiguousarray(arr), chunk_bytes)
            return
        box = tuple((0, n) for n in arr.shape)
        yield from pieces(
            "an array", [(box, arr)], arr.shape, arr.dtype, piece=chunk_bytes, device=False
        )
        return
    shape = tuple(arr.shape)
    stored = np.dtype(arr.dtype)
    device = streams(arr)
    if not device and len(arr.sharding.device_set) == 1:  # one CPU buffer: viewed in place
        yield from _slices(np.asarray(arr).view(stored), chunk_bytes)
        return
    what = f"of shape {shape} and dtype {stored}"
    blocks = blocks_of(what, arr)
    if math.prod(shape) == 0:
        return
    if not device and row_runs(blocks, shape):
        for _, data in blocks:
            host = np.asarray(data)
            yield from _slices(host.view(stored) if host.dtype != stored else host, chunk_bytes)
        return
    yield from pieces(what, blocks, shape, stored, piece=chunk_bytes, device=device)


def _slices(host: np.ndarray, chunk_bytes: int | None) -> Iterator[memoryview]:
    # numpy's stubs do not declare __buffer__ yet.
    view = memoryview(host.reshape(-1).view(np.uint8))  # pyright: ignore[reportArgumentType]
    if chunk_bytes is None or chunk_bytes >= view.nbytes:
        if view.nbytes:
            yield view
        return
    step = max(1, chunk_bytes)
    for at in range(0, view.nbytes, step):
        yield view[at : at + step]
