"""Making the files of a checkpoint durable with as few journal commits as possible."""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import os
import sys
from typing import Any

from ._pools import pool

__all__ = ["fsync_all"]

_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _sync_file_range() -> Any:
    """The C library's ``sync_file_range`` (Linux), or ``None`` (looked up once)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return fn


def _start_writeback(fds: list[int]) -> None:
    """Ask the kernel to start writing the dirty pages of ``fds`` (a hint: errors are ignored).

    Without it, the first ``fsync`` commits the others' new inodes while their
    data still waits for delayed allocation, and each later ``fsync`` needs a
    commit of its own; with it, one commit usually carries every file.
    """
    fn = _sync_file_range()
    if fn is not None:
        for fd in fds:
            fn(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def fsync_all(files: list[int], directories: list[int]) -> None:
    """fsync ``files`` and ``directories`` (descriptors), all at the same time.

    The files' writeback is started first; then the first descriptor is
    synced on the calling thread (``fsync`` releases the GIL) and the others on
    the pool, all at once: a disk with a queue serves them together, which
    even for a small checkpoint's three fsyncs took about half the time of
    syncing them in turn on the project's machine (a virtual disk).
    """
    fds = files + directories
    _start_writeback(files)
    futures = [pool().submit(os.fsync, fd) for fd in fds[1:]]
    try:
        os.fsync(fds[0])
    except BaseException:
        concurrent.futures.wait(futures)
        raise
    for future in futures:
        future.result()
