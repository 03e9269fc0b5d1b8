"""Keeping the checkpoint a small overwrite swapped out, to write the next one into its files.

Deleting a checkpoint frees its disk blocks. On some disks that is the
slowest part of a small overwrite: on ext4 without a journal and mounted with
``discard`` (as on many cloud VMs) every freed block is trimmed synchronously,
half a millisecond for the two files of a tiny checkpoint. A process that
overwrites the same small directory checkpoint again and again therefore keeps
the old one, under the temporary name the swap left it at (which carries this
process's id), as the *spare* of its target; the next overwrite writes into
the spare's two files in place, fsyncs them and swaps the spare in. No block is
freed and none allocated.

A spare is reused only when nothing else can see the change
(:func:`claim_files`): it still holds exactly ``manifest.json`` and
``arrays.npz``, neither has another hard link, and this process can take a
write lease on both, which Linux grants only while no other open file
description exists (a reader still holding the old checkpoint open keeps it
from being reused). The leases are held until the rewrite is synced, so a
reader that finds the spare in that time waits for it and then sees the new
pair whole. Anything else falls back to a fresh temporary directory.

Only the second and later overwrites of a target in a process keep one. At
most :data:`MAX_SPARES` targets keep a spare; interpreter exit (and
``_atomic.drain``) removes this process's spares, and the next export to a
target removes those of dead processes (they look like any other leftover
temporary).
"""

from __future__ import annotations

import atexit
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_SPARES",
    "SPARE_BYTES",
    "claim_files",
    "keep",
    "release_files",
    "remove_all",
    "take",
]

# A spare is kept only when each of its files is at most this big.
SPARE_BYTES = 1 << 20
MAX_SPARES = 16
_NAMES = ("arrays.npz", "manifest.json")

_SPARES: dict[Path, tuple[int, Path]] = {}  # target -> (pid that kept it, spare)
_SEEN: set[Path] = set()  # targets overwritten once already in this process
_SEEN_MAX = 4096
_LOCK = threading.Lock()
_EXIT_HOOK = False

try:  # Linux: write leases, and a signal for lease breaks that does nothing by default
    import fcntl as _fcntl
    import signal as _signal

    _LEASES: tuple[Callable[[int, int, int], Any], int, int, int, int, int] | None = (
        _fcntl.fcntl,
        _fcntl.F_SETLEASE,  # pyright: ignore[reportAttributeAccessIssue]
        _fcntl.F_SETSIG,  # pyright: ignore[reportAttributeAccessIssue]
        _signal.SIGURG,
        _fcntl.F_WRLCK,
        _fcntl.F_UNLCK,
    )
except (ImportError, AttributeError):  # pragma: no cover - not Linux
    _LEASES = None


def enabled() -> bool:
    """Whether spares are kept here (Linux, where write leases exist)."""
    return _LEASES is not None


def take(target: Path) -> Path | None:
    """Remove and return this process's spare for ``target``, if there is one."""
    with _LOCK:
        found = _SPARES.pop(target, None)
    if found is None:
        return None
    pid, spare = found
    if pid != os.getpid():  # inherited through fork: the parent's, not ours to touch
        return None
    return spare


def keep(target: Path, old: Path) -> bool:
    """Keep ``old`` (just swapped out of ``target``) as its spare; ``False`` if it does not qualify.

    It qualifies when it holds the two files of a small checkpoint, each a
    regular file of at most :data:`SPARE_BYTES` with no other hard link, and
    this is not the first overwrite of ``target`` in this process: a single
    overwrite leaves nothing behind.
    """
    if not enabled():
        return False
    with _LOCK:
        if target not in _SEEN:
            if len(_SEEN) >= _SEEN_MAX:
                _SEEN.clear()
            _SEEN.add(target)
            return False
    try:
        for name in _NAMES:
            info = os.lstat(os.path.join(old, name))
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_size > SPARE_BYTES:
                return False
    except OSError:
        return False
    evicted: list[Path] = []
    with _LOCK:
        global _EXIT_HOOK
        if not _EXIT_HOOK:
            atexit.register(remove_all)
            _EXIT_HOOK = True
        previous = _SPARES.pop(target, None)
        if previous is not None:
            evicted.append(previous[1])
        while len(_SPARES) >= MAX_SPARES:
            evicted.append(_SPARES.pop(next(iter(_SPARES)))[1])
        _SPARES[target] = (os.getpid(), old)
    for path in evicted:
        _remove(path)
    return True


def claim_files(spare: Path) -> tuple[int, list[int]] | None:
    """Open ``spare`` and its two files for rewriting, each under a write lease.

    Returns ``(directory fd, [arrays fd, manifest fd])``, or ``None`` (nothing
    left open) when the spare cannot be reused: it holds other entries, a file
    has another hard link, or another open file description exists.
    Release with :func:`release_files`.
    """
    if _LEASES is None:
        return None
    fcntl, setlease, setsig, sigurg, wrlck, _ = _LEASES
    try:
        dirfd = os.open(spare, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    fds: list[int] = []
    try:
        if sorted(os.listdir(dirfd)) != list(_NAMES):
            raise OSError("not the two files of a checkpoint")
        for name in _NAMES:
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
            fds.append(fd)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                raise OSError("a file is linked elsewhere")
            # A lease break would signal SIGIO, whose default action ends the process.
            fcntl(fd, setsig, sigurg)
            fcntl(fd, setlease, wrlck)  # EAGAIN: open elsewhere
    except OSError:
        release_files(dirfd, fds)
        return None
    return dirfd, fds


def release_files(dirfd: int, fds: list[int]) -> None:
    """Drop the leases taken by :func:`claim_files` and close its descriptors."""
    for fd in fds:
        if _LEASES is not None:
            fcntl, setlease, _, _, _, unlck = _LEASES
            try:
                fcntl(fd, setlease, unlck)
            except OSError:
                pass
        os.close(fd)
    os.close(dirfd)


def _remove(path: Path) -> None:
    from ._atomic import remove

    remove(path)


def remove_all() -> None:
    """Remove every spare this process kept (done at interpreter exit)."""
    with _LOCK:
        spares = list(_SPARES.values())
        _SPARES.clear()
    for pid, path in spares:
        if pid == os.getpid():
            _remove(path)
