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
  checkpoint is at the target path. (Without ``renameat2`` the directory swap
  falls back to two renames, with a short window where the path is missing.)

Temporaries left by a killed process carry its pid; the next export to the
same target removes those whose process is gone. They never block an export.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["STEP_HOOK", "clean_debris", "exchange", "rename_noreplace", "step", "temp_sibling"]

# Test hook: called with the name of each step boundary of an export.
STEP_HOOK: Callable[[str], None] | None = None

_TMP = ".jaxstruct-tmp-"
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def step(name: str) -> None:
    """Mark a step boundary of an export (for crash tests)."""
    if STEP_HOOK is not None:
        STEP_HOOK(name)


def temp_sibling(target: Path) -> Path:
    """Return a fresh temporary path next to ``target``."""
    return target.with_name(f".{target.name}{_TMP}{os.getpid()}-{secrets.token_hex(6)}")


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


def clean_debris(target: Path) -> None:
    """Remove temporaries of ``target`` left behind by processes that no longer exist."""
    prefix = f".{target.name}{_TMP}"
    try:
        names = os.listdir(target.parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix) :].partition("-")[0]
        if pid_text.isdigit() and not _alive(int(pid_text)):
            remove(target.parent / name)


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Call Linux ``renameat2``; return ``False`` when it is unavailable here."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
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
    """Put ``src`` at the existing ``dst`` atomically; return where the old ``dst`` went."""
    if not src.is_dir():
        os.replace(src, dst)
        return src  # nothing left at src
    if _renameat2(src, dst, _RENAME_EXCHANGE):
        return src
    old = temp_sibling(dst)
    os.rename(dst, old)
    os.rename(src, dst)
    return old
