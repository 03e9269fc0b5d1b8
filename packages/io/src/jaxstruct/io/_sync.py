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

# Up to this many bytes written in all, the files are fsynced one after the other
# on the calling thread, after each one's writeback has been started.
SYNC_INLINE = 1 << 20
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


def fsync_all(files: list[int], directories: list[int], nbytes: int) -> None:
    """fsync ``files`` and then ``directories`` (descriptors); ``nbytes`` were written in all.

    A small checkpoint's files are synced in turn on the calling thread once
    their writeback has started (waking threads would cost more than they
    save). A larger one's are synced at the same time: the first on the
    calling thread (``fsync`` releases the GIL), the others on the pool.
    """
    fds = files + directories
    if nbytes <= SYNC_INLINE:
        _start_writeback(files)
        for fd in fds:
            os.fsync(fd)
        return
    futures = [pool().submit(os.fsync, fd) for fd in fds[1:]]
    try:
        os.fsync(fds[0])
    except BaseException:
        concurrent.futures.wait(futures)
        raise
    for future in futures:
        future.result()
