"""Process-wide state: the worker threads, the collector pause, and the one fork handler.

Every module that keeps state a forked child must not inherit (threads it does
not have, locks they held, work in flight), in jaxstruct-io and in its plugins,
registers its reset here with :func:`at_fork`; this module installs the one
``os.register_at_fork`` handler of the project, which runs them in
registration order. The worker threads are one family: ``jaxstruct-io`` (up to
eight, for compression, fsyncs and the removal of old checkpoints) and
``jaxstruct-io-crc`` (two, for checksums computed while data is read or
written, so that they never queue behind a long compression). Plugins run their
own work on them through :func:`submit_to_workers` and :func:`map_on_workers`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import gc
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

# zlib-ng computes CRC-32 several times faster than zlib (23 against 3-4 GB/s here)
# and has crc32_combine (the CRC of a concatenation from its parts'), which zlib lacks.
from zlib_ng.zlib_ng import crc32, crc32_combine

T = TypeVar("T")
R = TypeVar("R")

_RESETS: list[Callable[[], None]] = []


def at_fork(reset: Callable[[], None]) -> Callable[[], None]:
    """Run ``reset`` in every child this process forks, after the resets registered before it.

    jaxstruct-io installs the project's one ``os.register_at_fork`` handler; a module
    (of io, or of a plugin) that keeps threads, locks or work in flight registers
    the function that forgets them, once, when it is imported. A reset that raises
    is reported with a ``RuntimeWarning`` in the child, and the others still run.
    Usable as a decorator.

    Args:
        reset: called with no arguments in the child, right after ``os.fork()``
            (only the thread that forked exists there).

    Returns:
        ``reset``.

    Example:
        >>> import threading
        >>> import jaxstruct.io as jio
        >>> _lock = threading.Lock()
        >>> @jio.at_fork
        ... def _fresh_lock() -> None:
        ...     global _lock
        ...     _lock = threading.Lock()  # a thread of the parent may have held it
    """
    _RESETS.append(reset)
    return reset


def _in_child() -> None:
    for reset in list(_RESETS):
        try:
            reset()
        except Exception as err:  # a plugin's bug must not stop io's own resets
            name = getattr(reset, "__qualname__", repr(reset))
            module = getattr(reset, "__module__", "?")
            warnings.warn(
                f"the fork reset {module}.{name} failed in a forked child "
                f"({type(err).__name__}: {err}); the other resets ran",
                RuntimeWarning,
                stacklevel=1,
            )


if hasattr(os, "register_at_fork"):  # pragma: no branch - every POSIX platform
    os.register_at_fork(after_in_child=_in_child)


WORKERS = max(1, min(8, os.cpu_count() or 1))
_CRC_WORKERS = 2

_POOLS: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()


def _lazy_pool(name: str, workers: int) -> concurrent.futures.ThreadPoolExecutor:
    found = _POOLS.get(name)
    if found is None:
        with _POOL_LOCK:
            found = _POOLS.get(name)
            if found is None:
                found = _POOLS[name] = concurrent.futures.ThreadPoolExecutor(
                    workers, thread_name_prefix=name
                )
    return found


@at_fork
def _forget_pools() -> None:
    """Drop the parent's pools (threads a fork did not copy) and its possibly held lock."""
    global _POOL_LOCK
    _POOLS.clear()
    _POOL_LOCK = threading.Lock()


def pool() -> concurrent.futures.ThreadPoolExecutor:
    """Return the worker pool (compression, fsyncs, removal of old checkpoints)."""
    return _lazy_pool("jaxstruct-io", WORKERS)


def crc_pool() -> concurrent.futures.ThreadPoolExecutor:
    """Return the two threads that compute checksums while data is read or written."""
    return _lazy_pool("jaxstruct-io-crc", _CRC_WORKERS)


def submit(
    workers: Callable[[], concurrent.futures.ThreadPoolExecutor], fn: Callable[..., T], *args: Any
) -> Future[T]:
    """Run ``fn(*args)`` on a pool, or on this thread once pools take no more work: at
    interpreter exit, a background export still running must finish, not fail."""
    try:
        return workers().submit(fn, *args)
    except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as err:
            done.set_exception(err)
        return done


def submit_to_workers(fn: Callable[..., T], /, *args: Any, checksums: bool = False) -> Future[T]:
    """Run ``fn(*args)`` on jaxstruct-io's worker threads; return its future.

    The threads are the ones io compresses, checksums and fsyncs on, created once per
    process (and again in a forked child): a plugin that computes CRCs or compresses
    in parallel uses them rather than threads of its own, so all of jaxstruct
    together keeps to their number. ``fn`` should release the GIL for most of its
    time (zlib-ng's ``crc32`` and compressors, NumPy copies, file I/O) and must not
    wait for other work on the same threads. At interpreter exit, once the threads
    take no more work, ``fn`` runs on the calling thread.

    Args:
        fn: the work.
        *args: its arguments.
        checksums: run it on the two checksum threads instead of the main pool (up
            to eight threads): for short checks made while data is read or written,
            which must not queue behind a long compression.

    Returns:
        A :class:`concurrent.futures.Future` of ``fn(*args)``.

    Example:
        >>> import jaxstruct.io as jio
        >>> from zlib_ng.zlib_ng import crc32
        >>> future = jio.submit_to_workers(crc32, b"jaxstruct", checksums=True)
        >>> future.result() == crc32(b"jaxstruct")
        True
    """
    return submit(crc_pool if checksums else pool, fn, *args)


def map_on_workers(
    fn: Callable[[T], R], items: Iterable[T], *, ahead: int | None = None, checksums: bool = False
) -> Iterator[R]:
    """Yield ``fn(item)`` for each of ``items``, in order, computed on io's worker threads.

    At most ``ahead`` items (default: twice the number of worker threads) are
    submitted beyond the one being yielded, so the inputs and results held at once
    stay bounded whatever the number of items: take ``items`` from a generator to
    make each input only when it is needed. Closing the iterator early cancels what
    has not started. An item's error is raised when its turn comes.

    Args:
        fn: the work, applied to one item.
        items: the inputs, consumed lazily.
        ahead: items in flight at most (at least 1).
        checksums: run on the two checksum threads (see :func:`submit_to_workers`).

    Example:
        >>> import jaxstruct.io as jio
        >>> from zlib_ng.zlib_ng import crc32
        >>> pieces = (bytes([i]) * 1024 for i in range(4))
        >>> [hex(c) for c in jio.map_on_workers(crc32, pieces, ahead=2)] == [
        ...     hex(crc32(bytes([i]) * 1024)) for i in range(4)
        ... ]
        True
    """
    depth = 2 * (_CRC_WORKERS if checksums else WORKERS) if ahead is None else max(1, ahead)
    workers = crc_pool if checksums else pool
    pending: collections.deque[Future[R]] = collections.deque()
    source = iter(items)
    try:
        for item in source:
            pending.append(submit(workers, fn, item))
            while len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


class CrcParts:
    """The CRC-32 of consecutive pieces, computed apart on the CRC threads, combined in order."""

    def __init__(self, start: int) -> None:
        self.start = start  # the CRC of what was read before
        self.parts: list[tuple[concurrent.futures.Future[int], int]] = []

    def add(self, piece: memoryview) -> None:
        self.parts.append((submit(crc_pool, crc32, piece), piece.nbytes))

    def result(self) -> int:
        crc = self.start
        for future, size in self.parts:
            crc = crc32_combine(crc, future.result(), size)
        return crc


_lock = threading.Lock()
_holders = 0  # blocks inside paused(), in every thread
_restore = False  # whether the collector was on when the first of them entered


@at_fork
def _reset_pause() -> None:
    """After a fork: a fresh lock, and no pause held by threads the child does not have."""
    global _lock, _holders
    _lock = threading.Lock()
    if _holders:
        _holders = 0
        if _restore:
            gc.enable()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Keep the cyclic collector off inside the block (restoring its previous state)."""
    global _holders, _restore
    with _lock:
        if _holders == 0:
            _restore = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            if _holders:  # zero when a fork reset the count inside this block
                _holders -= 1
                if _holders == 0 and _restore:
                    gc.enable()
