"""Opening files of an untrusted checkpoint: regular files only, never blocking."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from jaxstruct.registry import SerializationError

__all__ = ["open_noatime", "open_regular", "read_all"]


_NOATIME = getattr(os, "O_NOATIME", 0)


def open_noatime(path: Path, flags: int, dir_fd: int | None = None) -> int:
    """``os.open`` without updating the access time where the owner may ask for that.

    Reading a checkpoint should not write to it: on a ``relatime`` mount the
    first read after an export would otherwise update its files' inodes,
    which costs a small checkpoint's load a journal handle each. With
    ``dir_fd``, ``path``'s last component is opened in that directory.
    """
    name: Path | str = path if dir_fd is None else path.name
    if _NOATIME:
        try:
            return os.open(name, flags | _NOATIME, dir_fd=dir_fd)
        except PermissionError:  # O_NOATIME needs the file's owner (or CAP_FOWNER)
            pass
    return os.open(name, flags, dir_fd=dir_fd)


def open_regular(path: Path, *, follow: bool, dir_fd: int | None = None) -> tuple[int, int]:
    """Open ``path`` for reading and return ``(fd, size)``; only regular files are accepted.

    ``O_NONBLOCK`` keeps a FIFO from hanging the open; ``follow=False`` refuses
    symlinks (used for files inside a checkpoint directory). With ``dir_fd``
    (a descriptor of ``path``'s directory), the file is opened in it.

    Raises:
        FileNotFoundError: nothing exists at ``path``.
        SerializationError: ``path`` is not a regular file, or cannot be opened.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = open_noatime(path, flags, dir_fd)
    except FileNotFoundError:
        raise FileNotFoundError(f"{str(path)!r}: no such file") from None
    except OSError as err:
        if not follow and os.path.islink(path):
            raise SerializationError(
                f"{str(path)!r}: is a symbolic link; only regular files are read"
            ) from None
        raise SerializationError(f"{str(path)!r}: cannot be opened ({err.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SerializationError(
                f"{str(path)!r}: is not a regular file; only regular files are read"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def read_all(fd: int, size: int, where: str) -> bytes:
    """Read exactly ``size`` bytes from the start of ``fd``."""
    chunks: list[bytes] = []
    pos = 0
    while pos < size:
        chunk = os.pread(fd, min(size - pos, 1 << 24), pos)
        if not chunk:
            raise SerializationError(f"{where}: file shrank while being read")
        chunks.append(chunk)
        pos += len(chunk)
    return b"".join(chunks)
