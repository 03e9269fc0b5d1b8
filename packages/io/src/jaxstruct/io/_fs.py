"""Bytes on disk: safe opens, fsyncs, temporaries, atomic renames, parked checkpoints, debris."""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import functools
import hashlib
import os
import secrets
import shutil
import socket
import stat
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from jaxstruct.registry import SerializationError

from . import _process

# The process-wide state (pools, CRC threads, the collector pause) lives in _process;
# these names stay importable from here for the formats that use them.
from ._process import WORKERS as WORKERS  # noqa: PLC0414
from ._process import CrcParts as CrcParts  # noqa: PLC0414
from ._process import crc_pool as crc_pool  # noqa: PLC0414
from ._process import paused as paused  # noqa: PLC0414
from ._process import pool as pool  # noqa: PLC0414
from ._process import submit as submit  # noqa: PLC0414


class CheckpointWriteError(OSError, SerializationError):
    """Writing a checkpoint failed on disk; nothing was replaced.

    It carries the ``errno`` of the underlying ``OSError`` (``ENOSPC`` for a
    full disk), which is kept as its ``__cause__``.
    """


_NOATIME = getattr(os, "O_NOATIME", 0)  # Linux only
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_noatime(path: Path, flags: int, dir_fd: int | None = None) -> int:
    """``os.open`` without updating the access time where the owner may ask for that."""
    name: Path | str = path if dir_fd is None else path.name
    if _NOATIME:
        try:
            return os.open(name, flags | _NOATIME, dir_fd=dir_fd)
        except PermissionError:  # O_NOATIME needs the file's owner (or CAP_FOWNER)
            pass
    return os.open(name, flags, dir_fd=dir_fd)


def open_regular(path: Path, *, follow: bool, dir_fd: int | None = None) -> tuple[int, int]:
    """Open ``path`` for reading and return ``(fd, size)``; only regular files are accepted."""
    flags = _READ_FLAGS if follow else _READ_FLAGS | os.O_NOFOLLOW
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


def fsync_all(files: list[int], directories: list[int]) -> None:
    """fsync ``files`` and ``directories`` (descriptors), all at the same time."""
    start_writeback = _sync_file_range()
    if start_writeback is not None:  # a hint to start writing the files' pages: errors ignored
        for fd in files:
            start_writeback(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
    fds = files + directories
    futures = [submit(pool, os.fsync, fd) for fd in fds[1:]]
    try:
        os.fsync(fds[0])
    except BaseException:
        concurrent.futures.wait(futures)
        raise
    for future in futures:
        future.result()


# Test hook: called with the name of each step boundary of an export.
STEP_HOOK: Callable[[str], None] | None = None

_TMP = ".jaxstruct-tmp-"
_PARKED = ".jaxstruct-old-"
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100

#: Seconds without a change after which a leftover of another host (or of an
#: older jaxstruct, whose names carry no host tag) is taken for debris.
FOREIGN_AGE_S = 24 * 3600.0


def step(name: str) -> None:
    """Mark a step boundary of an export (for crash tests)."""
    if STEP_HOOK is not None:
        STEP_HOOK(name)


@functools.cache
def host_tag() -> str:
    """A short tag naming where this process's PIDs mean something: machine, boot, PID namespace."""
    parts = [socket.gethostname(), "", ""]
    try:
        parts[1] = Path("/proc/sys/kernel/random/boot_id").read_text()
        parts[2] = os.readlink("/proc/self/ns/pid")
    except OSError:  # not Linux: the host name alone
        pass
    digest = hashlib.blake2b("\0".join(parts).encode("utf-8", "replace"), digest_size=5)
    return "h" + digest.hexdigest()


def temp_sibling(target: Path, kind: str = _TMP) -> Path:
    """Return a fresh temporary path next to ``target`` (tagged with host and pid)."""
    name = f".{target.name}{kind}{host_tag()}-{os.getpid()}-{secrets.token_hex(6)}"
    return target.with_name(name)


def identity(path: Any, *, follow: bool = True) -> tuple[int, ...] | None:
    """What changes when ``path`` is replaced or edited (device, inode, size, modification
    and change times), or ``None`` when nothing is there: "has this file changed"."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return stat_identity(st)


def stat_identity(st: os.stat_result) -> tuple[int, ...]:
    """:func:`identity` of a file already stat-ed (``os.fstat`` of an open one)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def fsync_tree(path: Path) -> None:
    """fsync the file ``path``, or every file and directory under the directory ``path``
    (itself included), many at the same time (symbolic links are not followed)."""
    files: list[Path] = []
    directories: list[Path] = []
    if path.is_dir() and not path.is_symlink():
        for root, dirs, names in os.walk(path):
            directories.append(Path(root))
            for name in names:
                entry = Path(root) / name
                if entry.is_file() and not entry.is_symlink():
                    files.append(entry)
            dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink()]
    else:
        files.append(path)
    entries = [(entry, False) for entry in files] + [(entry, True) for entry in directories]
    batch = 64  # descriptors open at once
    for start in range(0, len(entries), batch):
        fds: list[int] = []
        dir_fds: list[int] = []
        try:
            for entry, is_dir in entries[start : start + batch]:
                fd = os.open(entry, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
                (dir_fds if is_dir else fds).append(fd)
            fsync_all(fds, dir_fds)
        finally:
            for fd in fds + dir_fds:
                os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush a directory entry to disk (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # pragma: no cover - a directory this process may not read
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's live process
        return True
    return True


def remove(path: Path) -> None:
    """Delete a file or directory tree, ignoring what is already gone."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def _last_change(path: Path) -> float:
    """The newest modification time of ``path`` and (for a directory) its entries."""
    try:
        newest = os.lstat(path).st_mtime
        if path.is_dir() and not path.is_symlink():
            with os.scandir(path) as entries:
                for entry in entries:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    except OSError:
        return time.time()  # vanishing or unreadable: in use
    return newest


def _is_debris(path: Path, prefix: str, now: float) -> bool:
    """Whether the leftover ``path`` (its name starts with ``prefix``) has no live writer."""
    tag, _, rest = path.name[len(prefix) :].partition("-")
    pid_text = rest.partition("-")[0]
    if tag == host_tag() and pid_text.isdigit():
        return not _alive(int(pid_text))
    return now - _last_change(path) > FOREIGN_AGE_S


def parked(target: Path) -> list[Path]:
    """Checkpoints parked beside ``target`` by the two-rename swap, the most recent first."""
    prefix = f".{target.name}{_PARKED}"
    found: list[tuple[float, Path]] = []
    try:
        with os.scandir(target.parent) as entries:
            for entry in entries:
                if entry.name.startswith(prefix):
                    try:
                        found.append((entry.stat(follow_symlinks=False).st_ctime, Path(entry.path)))
                    except OSError:
                        continue
    except OSError:
        return []
    return [path for _, path in sorted(found, key=lambda item: item[0], reverse=True)]


def clean_debris(target: Path) -> None:
    """Remove leftovers of ``target``'s finished writers, recovering a parked checkpoint first."""
    prefix = f".{target.name}."
    try:
        names = [n for n in os.listdir(target.parent) if n.startswith(prefix)]
    except OSError:
        return
    if not names:
        return
    temps: list[Path] = []
    parked_ones: list[Path] = []
    now = time.time()
    for kind, out in ((_TMP, temps), (_PARKED, parked_ones)):
        kind_prefix = f".{target.name}{kind}"
        for name in names:
            if not name.startswith(kind_prefix):
                continue
            path = target.parent / name
            if _is_debris(path, kind_prefix, now):
                out.append(path)
    if parked_ones and not os.path.lexists(target):
        for candidate in [p for p in parked(target) if p in parked_ones]:
            try:
                rename_noreplace(candidate, target)
            except OSError:
                continue
            fsync_dir(target.parent)
            parked_ones.remove(candidate)
            break
    for path in (*temps, *parked_ones):
        remove(path)


@functools.cache
def _renameat2_function() -> Any:
    """The C library's ``renameat2``, or ``None`` where there is none (looked up once)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Call Linux ``renameat2``; return ``False`` when it is unavailable here."""
    fn = _renameat2_function()
    if fn is None:
        return False
    result = fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), ctypes.c_uint(flags))
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(dst))


def rename_noreplace(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst`` atomically, failing with ``FileExistsError`` if ``dst`` exists."""
    try:
        if _renameat2(src, dst, _RENAME_NOREPLACE):
            return
        if not src.is_dir():
            os.link(src, dst)
            os.unlink(src)
            return
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "target exists", str(dst))
        os.rename(src, dst)
    except FileExistsError:
        raise
    except OSError as err:
        if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise FileExistsError(err.errno, "target exists", str(dst)) from None
        raise


def exchange(src: Path, dst: Path) -> Path:
    """Put ``src`` at the existing ``dst`` atomically; return where the old ``dst`` went."""
    if not src.is_dir():
        os.replace(src, dst)
        return src  # nothing left at src
    try:
        if _renameat2(src, dst, _RENAME_EXCHANGE):
            return src
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, "target vanished", str(dst)) from None
        raise
    old = temp_sibling(dst, _PARKED)
    os.rename(dst, old)  # FileNotFoundError if dst vanished
    try:
        step("parked")
        os.rename(src, dst)
    except BaseException as err:  # an interrupt between the renames too
        # Put the old checkpoint back before reporting the failure. If another writer
        # published at dst meanwhile, its checkpoint stays and the replaced one goes.
        try:
            rename_noreplace(old, dst)
        except FileExistsError:
            remove(old)
            if isinstance(err, OSError) and err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(errno.EEXIST, "published meanwhile", str(dst)) from None
        except OSError:
            pass
        raise
    return old


def make_parents(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each made durable in its own parent."""
    missing: list[Path] = []
    here = directory
    while not here.is_dir():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            if not path.is_dir():
                raise
        fsync_dir(path.parent)


def write_error(target: Any, err: OSError) -> CheckpointWriteError:
    """The error for a disk failure while writing the checkpoint ``target``."""
    return CheckpointWriteError(
        err.errno,
        f"{str(target)!r}: writing the checkpoint failed ({err.strerror or err}); "
        "nothing was replaced and any previous checkpoint there is intact. Free disk "
        "space or fix the permissions, then export again",
    )


def sweep_debris(target: Path, exists: bool) -> None:
    """Sweep the leftovers of ``target``'s finished writers: whenever ``target`` is missing
    (a parked checkpoint may need recovery) and at its first overwrite in this process."""
    if exists and target in _SWEPT:
        return
    clean_debris(target)
    if exists:
        if len(_SWEPT) >= _SWEPT_MAX:
            _SWEPT.clear()
        _SWEPT.add(target)


def delete_soon(old: Path) -> Future[None]:
    """Start deleting ``old`` on the pool (inline while a crash test watches the steps)."""
    if STEP_HOOK is not None:  # crash tests see every step on the calling thread
        done: Future[None] = Future()
        remove_old(old)
        done.set_result(None)
        return done
    return submit(pool, remove_old, old)


MANIFEST, ARRAYS = "manifest.json", "arrays.npz"  # the built-in formats' two files


def remove_old(old: Path) -> None:
    """Delete a swapped-out old checkpoint: three calls for a directory laid out as export
    writes it, else a walk (a file's swap leaves nothing at ``old``)."""
    try:
        os.unlink(os.path.join(old, MANIFEST))
        os.unlink(os.path.join(old, ARRAYS))
        os.rmdir(old)
    except OSError:
        remove(old)


# Targets whose debris this process has already swept (a sweep lists the parent).
_SWEPT: set[Path] = set()
_SWEPT_MAX = 4096
_process.at_fork(_SWEPT.clear)  # a forked child sweeps for itself
