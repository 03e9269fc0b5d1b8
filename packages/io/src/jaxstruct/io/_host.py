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
import math
import os
import re
import threading
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
from jaxstruct.registry import SerializationError

BUDGET_ENV = "JAXSTRUCT_HOST_BUDGET"
DEFAULT_BUDGET = 256 << 20
_MIN_BUDGET = 4096
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)
# Regions in flight at most: the budget is cut into this many regions' worth.
_DEPTH = 8
_SAMPLE_BYTES = 3 * 8 * 1024  # what a compression choice looks at (as ``_zip`` samples)

#: Tests: stream arrays that already lie in host memory too (CPU devices).
FORCE_STREAMING = False
#: Tests: called with the bytes of host memory in flight each time that number changes.
WATCH: Callable[[int], None] | None = None

T = TypeVar("T")
Block = tuple[tuple[tuple[int, int], ...], Any]  # (start, stop) per dim, single-device array
Region = tuple[tuple[int, int], ...]


def host_budget() -> int:
    """The host memory (bytes) copies from devices may hold at once (``JAXSTRUCT_HOST_BUDGET``)."""
    text = os.environ.get(BUDGET_ENV)
    if text is None or not text.strip():
        return DEFAULT_BUDGET
    found = _SIZE.match(text)
    size = int(found.group(1)) * _UNITS[found.group(2).lower()] if found else -1
    if size < _MIN_BUDGET:
        raise SerializationError(
            f"{BUDGET_ENV}={text!r} is not a host memory budget: expected a number of bytes "
            f"of at least {_MIN_BUDGET}, optionally with a K, M or G suffix (e.g. 256M); "
            "fix it or unset it for the default of 256 MiB"
        )
    return size


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
        out = jax.lax.slice(data, [a for a, _ in local], [b for _, b in local])
    if out is data:  # pragma: no cover - a JAX that returns its operand unchanged
        out = jax.make_array_from_single_device_arrays(data.shape, data.sharding, [data])
    out.copy_to_host_async()
    return out


#: The device-side step of a copy (tests replace it to fail in the middle).
copy_start: Callable[[Any, Region], Any] = _fresh


class _Started:
    """One region whose copies to the host are under way: its cost counts in its stream's
    share until every object holding its memory is gone (or it is settled at once)."""

    def __init__(
        self, region: Region, parts: list[tuple[Region, Any]], cost: int, share: _Share
    ) -> None:
        self.region = region
        self.parts = parts  # (place inside the region, device array being copied)
        self.cost = cost
        self.share = share
        self.alive = 0
        self.settled = False
        share.add(cost)

    def watch(self, obj: T) -> T:
        """Count the region's cost until ``obj`` is gone too."""
        with self.share.lock:
            self.alive += 1
        weakref.finalize(obj, self._gone)
        return obj

    def _gone(self) -> None:
        with self.share.lock:
            self.alive -= 1
            if self.alive:
                return
        self.settle()

    def settle(self) -> None:
        """Give the region's cost back (once)."""
        with self.share.lock:
            if self.settled:
                return
            self.settled = True
        self.share.free(self.cost)


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


def pieces(
    name: str,
    blocks: Sequence[Block],
    shape: tuple[int, ...],
    stored: np.dtype,
    *,
    budget: int,
    piece: int | None = None,
    ahead: int = _DEPTH,
) -> Generator[memoryview, None, None]:
    """Yield the bytes of the array made of ``blocks`` (which tile ``shape`` exactly once)
    in C order, as host memory views valid until the next one is asked for.

    All streams of the process together hold at most ``budget`` bytes of host
    memory at any time (one region more only if a region is larger than the
    budget); copies run ahead of the consumer, ``ahead`` regions of about
    ``piece`` bytes at most (default: an eighth of the budget), within that budget.

    Raises:
        SerializationError: a copy from a device failed (named with the array).
    """
    itemsize = stored.itemsize
    if piece is None:
        piece = budget // _DEPTH
        if math.prod(shape) * itemsize <= budget // 2:
            piece = math.prod(shape) * itemsize  # small: one region, one copy per shard
    else:  # room for the region the consumer holds and the next, at least
        piece = min(piece, budget // 4)
    piece = max(piece, itemsize)
    todo = _regions(shape, itemsize, piece)
    following = next(todo, None)
    if following is None:
        return
    # This stream's share of the budget, taken while it holds nothing (so that streams
    # on several threads never wait for one another while holding some), given back
    # once the stream has ended and the host memory of its regions is freed.
    want = min(budget, 2 * math.prod(shape) * itemsize, (ahead + 1) * 2 * piece)
    share = _Share(want, min(want, 4 * piece), budget)
    pending: collections.deque[_Started] = collections.deque()
    try:
        while following is not None or pending:
            # Start copies ahead while the share allows: the regions ahead and the one the
            # consumer still holds fit in it. With none ahead one is started even beyond
            # it, which happens only when one element is larger than a quarter of the budget.
            while following is not None and len(pending) < ahead:
                found, cost = _plan(following, blocks, itemsize)
                if pending and share.held + cost > share.ticket:
                    break
                job = _Started(following, [], cost, share)
                try:
                    for dest, local, data in found:
                        job.parts.append((dest, job.watch(copy_start(data, local))))
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
        share.end()


class _Share:
    """One stream's part of the budget, and the host bytes of its regions still alive."""

    def __init__(self, want: int, least: int, limit: int) -> None:
        # A thread whose earlier stream still holds memory (its consumer keeps a view)
        # never waits: it would wait for itself.
        self.owner = _held_by_thread()
        self.ticket = _BUDGET.acquire(want, least, limit, wait=not self.owner[0])
        self.owner[0] += 1
        self.held = 0
        self.ended = False
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.held += n

    def free(self, n: int) -> None:
        with self.lock:
            self.held -= n
            self._give_back()

    def end(self) -> None:
        with self.lock:
            self.ended = True
            self._give_back()

    def _give_back(self) -> None:
        if self.ended and self.held == 0 and self.ticket:
            ticket, self.ticket = self.ticket, 0
            self.owner[0] -= 1
            _BUDGET.release(ticket)


_THREADS = threading.local()


def _held_by_thread() -> list[int]:
    """The number of shares this thread has taken and not given back (a mutable cell)."""
    cell = getattr(_THREADS, "shares", None)
    if cell is None:
        cell = _THREADS.shares = [0]
    return cell


class _Budget:
    """The host bytes that the streams of this process have taken, within the budget."""

    def __init__(self) -> None:
        self.used = 0
        self.cond = threading.Condition()

    def acquire(self, want: int, least: int, limit: int, *, wait: bool) -> int:
        """Take up to ``want`` bytes and at least ``least`` (all of ``limit`` if less is
        used than that), waiting (``wait``) until ``least`` fits beside what others hold."""
        with self.cond:
            while wait and self.used and self.used + least > limit:
                self.cond.wait()
            got = max(least, min(want, limit - self.used))
            self.used += got
            used = self.used
        if WATCH is not None:
            WATCH(used)
        return got

    def release(self, n: int) -> None:
        with self.cond:
            self.used -= n
            used = self.used
            self.cond.notify_all()
        if WATCH is not None:
            WATCH(used)


_BUDGET = _Budget()


def _forget_in_child() -> None:
    """After a fork: the parent's streams run in threads the child does not have."""
    global _BUDGET
    _BUDGET = _Budget()


os.register_at_fork(after_in_child=_forget_in_child)


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


def sample(name: str, blocks: Sequence[Block], shape: tuple[int, ...], stored: np.dtype) -> bytes:
    """The first bytes of the array (a few KiB), copied alone, for choosing a compression."""
    out = bytearray()
    stream = pieces(name, blocks, shape, stored, budget=host_budget(), piece=_SAMPLE_BYTES, ahead=1)
    try:
        for view in stream:
            out += view[: _SAMPLE_BYTES - len(out)]
            if len(out) >= _SAMPLE_BYTES:
                break
    finally:
        stream.close()
    return bytes(out)
