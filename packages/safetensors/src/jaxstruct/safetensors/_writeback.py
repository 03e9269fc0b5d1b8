"""Starting the disk writes of a file while it is written, so that its fsync waits for little.

A file written into the page cache reaches the disk only when the kernel gets
to it, or when ``fsync`` makes the writer wait for all of it: an export's
fsync of 1 GiB took 0.27-0.34 s after the write (measured). Linux's
``sync_file_range(SYNC_FILE_RANGE_WRITE)`` starts writing a file's dirty pages
without waiting; called while the file is being written, the disk works during
the write, and the fsync after it took 0.003-0.025 s. Elsewhere (no
``sync_file_range``) these are no-ops and the fsync does all the work.

The safetensors library writes its file in one call that releases the GIL, so
:class:`Writeback` watches a directory from a thread instead: every file that
appears in it (the library's temporary, alone in a directory of jaxstruct's)
gets its writeback started every :data:`INTERVAL_S` seconds.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["INTERVAL_S", "Writeback", "start_writeback"]

#: How often the watched file's writeback is started.
INTERVAL_S = 0.05
_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _sync_file_range() -> Any:
    """The C library's ``sync_file_range``, or ``None`` where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):  # pragma: no cover - a libc without it
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def start_writeback(fd: int) -> None:
    """Start writing the dirty pages of the open file ``fd`` to disk, without waiting."""
    fn = _sync_file_range()
    if fn is not None:
        fn(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # a hint: a failure costs only the head start


class Writeback:
    """While open, start the writeback of the files appearing in ``folder`` now and then."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> Writeback:
        if _sync_file_range() is not None:
            self.thread = threading.Thread(target=self._run, name="safetensors-writeback")
            self.thread.daemon = True
            self.thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()

    def _run(self) -> None:
        files: dict[str, int] = {}
        try:
            while not self.stop.wait(INTERVAL_S):
                try:
                    with os.scandir(self.folder) as entries:
                        names = [e.name for e in entries if e.name not in files]
                except OSError:
                    names = []
                for name in names:
                    try:
                        files[name] = os.open(self.folder / name, os.O_RDONLY)
                    except OSError:  # renamed away meanwhile
                        continue
                for fd in files.values():
                    start_writeback(fd)
        finally:
            for fd in files.values():
                os.close(fd)
