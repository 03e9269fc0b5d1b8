"""Process-wide state: the worker pools, the CRC threads, the collector pause, fork resets.

Every module of io that keeps state a forked child must not inherit (threads it
does not have, locks they held, work in flight) registers its reset here with
:func:`at_fork`; this module installs the one ``os.register_at_fork`` handler
that runs them, in registration order.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

# zlib-ng computes CRC-32 several times faster than zlib (23 against 3-4 GB/s here)
# and has crc32_combine (the CRC of a concatenation from its parts'), which zlib lacks.
from zlib_ng.zlib_ng import crc32, crc32_combine

T = TypeVar("T")

_RESETS: list[Callable[[], None]] = []


def at_fork(reset: Callable[[], None]) -> Callable[[], None]:
    """Run ``reset`` in every child this process forks (after the resets registered before)."""
    _RESETS.append(reset)
    return reset


def _in_child() -> None:
    for reset in _RESETS:
        reset()


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
    """Return the two threads that check the CRCs of big members while they are read."""
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
