"""Publishing a checkpoint so that a crash never loses the previous one.

A checkpoint is first written in full to a temporary sibling
``.<name>.jaxstruct-tmp-<pid>-<random>`` (same directory, so the same
filesystem), every file and the directory are fsynced, and only then is it
moved into place:

* without ``overwrite``: ``renameat2(RENAME_NOREPLACE)`` on Linux (``link`` +
  ``unlink`` for files, ``rename`` onto a missing directory elsewhere), so of
  two concurrent writers exactly one wins and the other gets
  ``FileExistsError``;
* with ``overwrite``: a file is replaced with ``os.replace``; a directory is
  swapped with ``renameat2(RENAME_EXCHANGE)`` and the old one, now under the
  temporary name, is deleted afterwards. At every instant the old or the new
  checkpoint is at the target path. Without ``renameat2`` the directory swap
  falls back to two renames: the old checkpoint is first *parked* under
  ``.<name>.jaxstruct-old-<pid>-<random>``, then the new one is renamed into
  place. A crash between the two leaves no checkpoint at the target, so the
  next export to that target first moves the parked checkpoint back. If
  another ``overwrite=True`` writer creates the target first, the loser
  replaces it: both succeed and one whole checkpoint remains.

Temporaries left by a killed process carry its pid; an export to the same
target removes those whose process is gone (after recovering a parked
checkpoint). Every export to a missing target looks for them; a process that
keeps overwriting one target looks once (listing the parent directory each
time would cost a small checkpoint a good part of its export). They never
block an export.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import secrets
import shutil
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from jaxstruct.registry import SerializationError

from . import _spare

__all__ = [
    "STEP_HOOK",
    "clean_debris",
    "drain",
    "exchange",
    "fsync_dir",
    "publish",
    "rename_noreplace",
    "step",
    "temp_sibling",
]

# Test hook: called with the name of each step boundary of an export.
STEP_HOOK: Callable[[str], None] | None = None

_TMP = ".jaxstruct-tmp-"
_PARKED = ".jaxstruct-old-"
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def step(name: str) -> None:
    """Mark a step boundary of an export (for crash tests)."""
    if STEP_HOOK is not None:
        STEP_HOOK(name)


def temp_sibling(target: Path, kind: str = _TMP) -> Path:
    """Return a fresh temporary path next to ``target``."""
    return target.with_name(f".{target.name}{kind}{os.getpid()}-{secrets.token_hex(6)}")


def fsync_dir(path: Path) -> None:
    """Flush a directory entry to disk (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - Windows
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


def _dead_debris(target: Path, names: list[str]) -> tuple[list[Path], list[Path]]:
    """Split leftovers of dead processes into ``(temporaries, parked checkpoints)``."""
    temps: list[Path] = []
    parked: list[Path] = []
    for kind, out in ((_TMP, temps), (_PARKED, parked)):
        prefix = f".{target.name}{kind}"
        for name in names:
            if not name.startswith(prefix):
                continue
            pid_text = name[len(prefix) :].partition("-")[0]
            if pid_text.isdigit() and not _alive(int(pid_text)):
                out.append(target.parent / name)
    return temps, parked


def clean_debris(target: Path) -> None:
    """Remove leftovers of ``target`` from dead processes, recovering a parked checkpoint first.

    A checkpoint parked by a process killed between the two renames of the
    fallback swap is moved back to ``target`` when nothing is there; only
    then is anything deleted.
    """
    prefix = f".{target.name}."
    try:
        names = [n for n in os.listdir(target.parent) if n.startswith(prefix)]
    except OSError:
        return
    if not names:
        return
    temps, parked = _dead_debris(target, names)
    if parked and not os.path.lexists(target):
        for candidate in parked:
            try:
                rename_noreplace(candidate, target)
            except OSError:
                continue
            fsync_dir(target.parent)
            parked.remove(candidate)
            break
    for path in (*temps, *parked):
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
    except FileExistsError:
        raise
    except OSError as err:
        if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise FileExistsError(err.errno, "target exists", str(dst)) from None
        raise
    if src.is_dir():
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "target exists", str(dst))
        try:
            os.rename(src, dst)
        except OSError as err:
            if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(err.errno, "target exists", str(dst)) from None
            raise
    else:
        os.link(src, dst)
        os.unlink(src)


def exchange(src: Path, dst: Path) -> Path:
    """Put ``src`` at the existing ``dst`` atomically; return where the old ``dst`` went.

    Raises:
        FileNotFoundError: ``dst`` vanished meanwhile (nothing was moved).
    """
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
    step("parked")
    try:
        os.rename(src, dst)
    except OSError:
        # Put the old checkpoint back before reporting the failure.
        try:
            rename_noreplace(old, dst)
        except OSError:
            pass
        raise
    return old


def _make_parents(directory: Path) -> None:
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


def publish(
    target: Path,
    write: Callable[[Path], None],
    *,
    overwrite: bool,
    is_ours: Callable[[Path], bool],
    what: str = "checkpoint",
    checked: bool = False,
    rewrite: Callable[[Path], bool] | None = None,
) -> None:
    """Create a checkpoint at ``target`` so that a crash never loses the one already there.

    ``write(tmp)`` creates the whole checkpoint, fsynced, at a fresh temporary
    sibling ``tmp``; it is then moved into place atomically and the parent
    directory is fsynced. Missing parent directories are created.

    Args:
        target: absolute path of the checkpoint.
        write: creates the checkpoint at the path it is given.
        overwrite: whether an existing checkpoint may be replaced.
        is_ours: whether an existing path is a checkpoint that ``overwrite`` may replace.
        what: names what ``is_ours`` accepts in messages (``"zip checkpoint"``).
        checked: the caller has just found that ``target`` is a checkpoint
            ``is_ours`` accepts (it is not looked at again unless it vanishes).
        rewrite: writes the checkpoint, as ``write`` does, into an old
            checkpoint kept as the target's spare (``_spare``), or returns
            ``False`` when it cannot. With it, an old checkpoint this export
            swaps out may be kept as the next spare instead of being deleted.

    Raises:
        FileExistsError: ``target`` exists and ``overwrite`` is false.
        SerializationError: ``target`` exists and is not a checkpoint ``is_ours`` accepts.
        CheckpointWriteError: ``write`` failed with an ``OSError``; nothing was replaced.
    """
    from ._errors import CheckpointWriteError

    def refuse_existing() -> None:
        if not overwrite:
            raise FileExistsError(
                f"{str(target)!r} already exists; pass overwrite=True to replace it, or choose "
                "another path"
            )
        if not is_ours(target):
            raise SerializationError(
                f"{str(target)!r} exists and is not a jaxstruct {what}; "
                "overwrite=True only replaces checkpoints. Remove it yourself, or choose "
                "another path"
            )

    exists = os.path.lexists(target)
    if exists and not checked:
        refuse_existing()
    checked = exists
    if not exists:
        _make_parents(target.parent)
    if not exists or target not in _SWEPT:
        # Debris is swept whenever the target is missing (a parked checkpoint may
        # need recovery) and at the first overwrite of a target in this process.
        clean_debris(target)
        if exists:
            if len(_SWEPT) >= _SWEPT_MAX:
                _SWEPT.clear()
            _SWEPT.add(target)
    if not checked and os.path.lexists(target):  # a parked checkpoint was recovered
        refuse_existing()
        checked = True
    spare = _spare.take(target) if rewrite is not None else None
    tmp = temp_sibling(target) if spare is None else spare
    old: Path | None = None
    try:
        try:
            if spare is None or not rewrite(spare):  # pyright: ignore[reportOptionalCall]
                if spare is not None:
                    remove(spare)
                    tmp = temp_sibling(target)
                write(tmp)
            if not os.path.lexists(tmp):
                raise SerializationError(
                    f"{str(target)!r}: writing the {what} returned without creating it; "
                    "nothing was replaced"
                )
        except OSError as err:
            raise CheckpointWriteError(
                err.errno,
                f"{str(target)!r}: writing the checkpoint failed ({err.strerror or err}); "
                "nothing was replaced and any previous checkpoint there is intact. Free disk "
                "space or fix the permissions, then export again",
            ) from err
        step("written")
        while True:
            if os.path.lexists(target):
                if not checked:
                    refuse_existing()  # someone else created it during this export
                try:
                    old = exchange(tmp, target)
                    break
                except FileNotFoundError:
                    continue  # it vanished again: publish as new
            try:
                rename_noreplace(tmp, target)
                break
            except FileExistsError:
                if not overwrite:
                    raise FileExistsError(
                        f"{str(target)!r} was created by someone else during this export; "
                        "pass overwrite=True to replace it"
                    ) from None
                checked = False
        fsync_dir(target.parent)
        step("published")
    finally:
        # On success this removes the swapped-out old checkpoint; on failure the
        # half-written temporary. The target itself is never touched here.
        if old is not None and old.is_dir():
            # A parked name (the fallback swap) is never kept: after a crash the
            # next export could take it for a checkpoint to recover.
            if rewrite is None or _TMP not in old.name or not _spare.keep(target, old):
                _remove_later(old)
        else:
            remove(old if old is not None else tmp)
    step("done")


def _remove_later(path: Path) -> None:
    """Delete a swapped-out old checkpoint on the worker pool (unlinking is slow on some disks).

    It already sits under a temporary name that carries this process's id:
    if the process dies first, the next export to the target removes it.
    """
    if STEP_HOOK is not None:  # crash tests observe every step on the calling thread
        remove(path)
        return
    if _remove_known(path):
        return
    names = _small_tree(path)
    if names is not None:
        # A small checkpoint goes faster than a hand-over to a thread: unlink its
        # few files and the directory directly (rmtree's safe walk costs more).
        try:
            for name in names:
                os.unlink(os.path.join(path, name))
            os.rmdir(path)
        except OSError:
            remove(path)
        return
    from ._pools import pool

    with _PENDING_LOCK:
        _PENDING.append(pool().submit(remove, path))
        _PENDING[:] = [f for f in _PENDING if not f.done()]


def _remove_known(path: Path) -> bool:
    """Delete a small checkpoint laid out as export writes it; return whether it is gone.

    A directory holding just ``manifest.json`` and a small ``arrays.npz`` goes
    with four system calls; anything else is left for the careful removal.
    """
    try:
        if os.lstat(os.path.join(path, "arrays.npz")).st_size > _SMALL_TREE:
            return False
        os.unlink(os.path.join(path, "manifest.json"))
        os.unlink(os.path.join(path, "arrays.npz"))
        os.rmdir(path)
    except OSError:
        return False
    return True


_SMALL_TREE = 8 << 20  # bytes: unlinking this much takes well under a millisecond
_SMALL_TREE_FILES = 16


def _small_tree(path: Path) -> list[str] | None:
    """The names in ``path`` if it is a directory of a few small regular files, else ``None``."""
    names: list[str] = []
    try:
        with os.scandir(path) as entries:
            total = 0
            for entry in entries:
                if len(names) >= _SMALL_TREE_FILES or not entry.is_file(follow_symlinks=False):
                    return None
                total += entry.stat(follow_symlinks=False).st_size
                if total > _SMALL_TREE:
                    return None
                names.append(entry.name)
    except OSError:
        return None
    return names


# Targets whose debris this process has already swept (a sweep lists the parent).
_SWEPT: set[Path] = set()
_SWEPT_MAX = 4096
_PENDING: list[Future[None]] = []
_PENDING_LOCK = threading.Lock()


def drain() -> None:
    """Wait until every old checkpoint scheduled for removal is gone, and remove the spares.

    Interpreter exit does both anyway; ``os._exit`` does not (what it leaves
    behind is removed by the next export to the same target).
    """
    _spare.remove_all()
    with _PENDING_LOCK:
        pending = list(_PENDING)
        _PENDING.clear()
    for future in pending:
        future.result()
