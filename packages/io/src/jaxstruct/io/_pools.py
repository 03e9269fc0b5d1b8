"""The io package's worker threads: created on first use, shared by every export and load.

A forked child starts without them (their threads exist only in the parent,
and a future submitted to them would never run): :func:`os.register_at_fork`
drops the pools and their lock in the child, which creates its own on first use.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading

__all__ = ["WORKERS", "crc_pool", "pool"]

WORKERS = max(1, min(8, os.cpu_count() or 1))
_CRC_WORKERS = 2

_POOLS: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()


def _lazy_pool(name: str, workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """Return the pool ``name``, created on first use and reused afterwards."""
    found = _POOLS.get(name)
    if found is None:
        with _POOL_LOCK:
            found = _POOLS.get(name)
            if found is None:
                found = _POOLS[name] = concurrent.futures.ThreadPoolExecutor(
                    workers, thread_name_prefix=name
                )
    return found


def _forget_in_child() -> None:
    """Drop the parent's pools (threads a fork did not copy) and its possibly held lock."""
    global _POOL_LOCK
    _POOLS.clear()
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):  # pragma: no branch - every POSIX platform
    os.register_at_fork(after_in_child=_forget_in_child)


def pool() -> concurrent.futures.ThreadPoolExecutor:
    """Return the worker pool (compression, fsyncs, removal of old checkpoints)."""
    return _lazy_pool("jaxstruct-io", WORKERS)


def crc_pool() -> concurrent.futures.ThreadPoolExecutor:
    """Return the two threads that check the CRCs of big members while they are read."""
    return _lazy_pool("jaxstruct-io-crc", _CRC_WORKERS)
