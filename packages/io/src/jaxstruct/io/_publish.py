"""Publishing a checkpoint: making what a format wrote durable and putting it at its path.

This is the one home of durability. Every format's output goes through it, the
built-in formats', jaxstruct-safetensors', jaxstruct-orbax's and any plugin's:

- **durable**: :func:`make_durable` fsyncs what a format's ``write`` made (every file
  and directory under its temporary, many at a time) before it is renamed into
  place, and :func:`fsync_dir` the directory it was renamed in; a format writing
  big files may flush them while it writes (:func:`flush_while_writing`).
- **into place**: the temporary sibling (:func:`temp_sibling`, named after this
  host and process), ``renameat2`` (or the two-rename fallback, which parks the
  previous checkpoint beside the path for a moment: :func:`parked`), and the
  debris of writers that died (:func:`sweep_debris`).
- **the route**: :class:`Publication` is made once per export, before anything is
  encoded (an existing path that may not be replaced is refused there), and picks
  one of four routes from the format and the run:

  - **sibling** (the built-in formats, and any format that does not publish
    atomically itself): the format writes a fresh temporary sibling, which is
    made durable, then renamed over the path; the old checkpoint is deleted after
    the swap.
  - **primary** (the same, in a multi-process run of a format written by one
    process): process 0 takes the sibling route; the others wait for its word.
  - **in place** (a format that publishes atomically itself, a URL with nothing to
    replace): every process of a multi-process format writes at the URL, collectively.
  - **staged** (the same format at a local path, and ``overwrite=True`` at a URL):
    every process writes a staged sibling (at a URL: where the format's remote
    directory says), then process 0 renames it into place, or swaps it in. A local
    path is never written in place: a self-publishing format may commit through a
    temporary of a fixed name (orbax's ``NAME.orbax-checkpoint-tmp``), which two
    writers of one path would share, publishing a mix of both checkpoints.

``export`` drives a publication in three calls, with the format's ``write`` (and the
check of what it wrote) in between: :meth:`Publication.begin` says where the format
writes, :meth:`Publication.finish` publishes it (or removes it after a failure).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
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
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from jaxstruct.registry import SerializationError, StructError

from . import _multihost, _process
from ._contract import format_failed, owns_failed, source_of
from ._formats import URL, Format, PendingWrite, RemoteDirectory, identity
from ._zip import ARRAYS, MANIFEST


class CheckpointWriteError(OSError, SerializationError):
    """Writing a checkpoint failed on disk; nothing was replaced.

    It carries the ``errno`` of the underlying ``OSError`` (``ENOSPC`` for a
    full disk), which is kept as its ``__cause__``.
    """


def write_error(target: Any, err: OSError, who: str = "") -> CheckpointWriteError:
    """The error for a disk failure while writing the checkpoint ``target`` (``who``: the
    format, when it is a plugin's, named in the message)."""
    by = f" (while {who} wrote it)" if who else ""
    return CheckpointWriteError(
        err.errno,
        f"{str(target)!r}: writing the checkpoint failed ({err.strerror or err}){by}; "
        "nothing was replaced and any previous checkpoint there is intact. Free disk "
        "space or fix the permissions, then export again",
    )


# -- the steps of an export, for crash tests ----------------------------------------------

#: Test hook: called with the name of each step boundary of an export.
STEP_HOOK: Callable[[str], None] | None = None


def step(name: str) -> None:
    """Mark a step boundary of an export (for crash tests); formats' ``write`` get it."""
    if STEP_HOOK is not None:
        STEP_HOOK(name)


# -- durable: fsyncs ------------------------------------------------------------------------

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
    futures = [_process.submit(_process.pool, os.fsync, fd) for fd in fds[1:]]
    try:
        os.fsync(fds[0])
    except BaseException:
        concurrent.futures.wait(futures)
        raise
    for future in futures:
        future.result()


_SYNC_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_SYNC_BATCH = 64  # descriptors open at once


def make_durable(path: str | os.PathLike[str]) -> None:
    """fsync ``path``: a file, or a directory with every file and directory under it.

    ``export`` calls it on what a format's ``write`` created, before renaming it
    into place (a format needs no fsync of its own); a format that publishes
    atomically itself calls it on what it wrote before its commit. Many files are
    fsynced at the same time, on jaxstruct's worker threads; symbolic links are
    not followed.

    Raises:
        OSError: the disk failed (``EIO``, ``ENOSPC``, ...).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> directory = Path(tempfile.mkdtemp())
        >>> _ = (directory / "weights.bin").write_bytes(b"abc")
        >>> make_durable(directory)
    """
    try:
        top = os.open(path, _SYNC_FLAGS | os.O_DIRECTORY)
    except NotADirectoryError:
        fd = os.open(path, _SYNC_FLAGS)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    try:
        _sync_directory(top)
    finally:
        os.close(top)


def _sync_directory(folder: int) -> None:
    """fsync the directory open as ``folder``, its files, and every directory below."""
    files: list[int] = []
    below: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    if len(files) == _SYNC_BATCH:  # descriptors open at once
                        fsync_all(files, [])
                        _close(files)
                    files.append(os.open(entry.name, _SYNC_FLAGS, dir_fd=folder))
                elif entry.is_dir(follow_symlinks=False):
                    below.append(entry.name)
        fsync_all(files, [folder])
    finally:
        _close(files)
    for name in below:
        inner = os.open(name, _SYNC_FLAGS | os.O_DIRECTORY, dir_fd=folder)
        try:
            _sync_directory(inner)
        finally:
            os.close(inner)


def _close(fds: list[int]) -> None:
    while fds:
        os.close(fds.pop())


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


#: Seconds between the flushes of a file being written (each waits for the last).
FLUSH_EVERY_S = 0.05


@contextlib.contextmanager
def flush_while_writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Flush what the ``with`` block writes at ``path`` to disk while it writes.

    ``path`` is the file being written, or a directory whose files are (each is
    found once it appears). A thread of the call runs ``fdatasync`` on them in a
    loop, and once more when the block ends, so that the disk writes while the
    files are still being filled: the fsync ``export`` makes before publishing
    then has little left to wait for. Worth it for big files only (jaxstruct-safetensors
    uses it from 64 MiB on: 0.3 s for 1 GiB became a few ms); a failed flush
    stops the flushing, and the fsync after the write reports what matters.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> target = Path(tempfile.mkdtemp()) / "tensors.bin"
        >>> with open(target, "xb") as file, flush_while_writing(target):
        ...     _ = file.write(bytes(1 << 16))
    """
    where = os.fspath(path)
    done = threading.Event()

    def flush() -> None:
        open_fds: dict[str, int] = {}
        try:
            while True:
                # One more pass once the writing has ended: the tail, and a file written
                # faster than the thread first looked (so every file is flushed here).
                last = done.is_set()
                for name in _written_files(where):
                    if name not in open_fds:
                        try:
                            open_fds[name] = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
                        except FileNotFoundError:  # renamed meanwhile: found next time
                            continue
                for fd in open_fds.values():
                    os.fdatasync(fd)
                if last:
                    break
                done.wait(FLUSH_EVERY_S)
        except OSError:
            pass
        finally:
            for fd in open_fds.values():
                os.close(fd)

    thread = threading.Thread(target=flush, name="jaxstruct-flush", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _written_files(where: str) -> list[str]:
    """The regular files at ``where``: itself, or those directly in the directory."""
    try:
        mode = os.stat(where).st_mode
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(mode):
        return [where] if stat.S_ISREG(mode) else []
    with os.scandir(where) as entries:
        return [e.path for e in entries if e.is_file(follow_symlinks=False)]


def replace_file(target: Path, data: bytes) -> None:
    """Put ``data`` at ``target`` atomically and durably (a small file replaced whole)."""
    tmp = temp_sibling(target)
    try:
        with open(tmp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        remove(tmp)
        raise
    fsync_dir(target.parent)


# -- into place: temporaries, renames, parked checkpoints, debris ------------------------

_TMP = ".jaxstruct-tmp-"
_PARKED = ".jaxstruct-old-"
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100

#: Seconds without a change after which a leftover of another host (or of an
#: older jaxstruct, whose names carry no host tag) is taken for debris.
FOREIGN_AGE_S = 24 * 3600.0


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
    return _process.submit(_process.pool, remove_old, old)


def remove_old(old: Path) -> None:
    """Delete a swapped-out old checkpoint: three calls for a directory laid out as export
    writes it, else a walk (a file's swap leaves nothing at ``old``)."""
    try:
        os.unlink(os.path.join(old, MANIFEST))
        os.unlink(os.path.join(old, ARRAYS))
        os.rmdir(old)
    except OSError:
        remove(old)


def remove_written(at: Path) -> None:
    """Remove what a failed write left: ``at``, and what a format made beside it under a
    name derived from it (``at`` + ``".part"``): its random part makes such a name this
    export's alone. Nothing else is touched: a file the format made elsewhere may be a
    user's, and its message names it."""
    remove(at)
    try:
        names = [n for n in os.listdir(at.parent) if n.startswith(at.name)]
    except OSError:
        return
    for name in names:
        remove(at.parent / name)


# Targets whose debris this process has already swept (a sweep lists the parent).
_SWEPT: set[Path] = set()
_SWEPT_MAX = 4096
_process.at_fork(_SWEPT.clear)  # a forked child sweeps for itself


# -- one export per path at a time --------------------------------------------------------

_lock = threading.Lock()
_in_flight: dict[str, threading.Event] = {}  # path -> set when its background export ends


@_process.at_fork
def _forget_in_child() -> None:
    """After a fork: the parent's background writes run in threads the child does not have."""
    global _lock
    _lock = threading.Lock()
    _in_flight.clear()


def wait_for_previous(key: str) -> None:
    """Wait for an in-flight export to the same path, ignoring its error (its caller sees it)."""
    with _lock:
        previous = _in_flight.get(key)
    if previous is not None:
        previous.wait()


def register(key: str, finished: threading.Event) -> None:
    """Record a background export of the path ``key``, which sets ``finished`` when it ends."""
    with _lock:
        _in_flight[key] = finished


def unregister(key: str, finished: threading.Event) -> None:
    """Forget the background export of ``key`` that set ``finished``."""
    with _lock:
        if _in_flight.get(key) is finished:
            del _in_flight[key]


# -- the publication ------------------------------------------------------------------------


def local_paths_only(where: str, fmt: Format) -> SerializationError:
    """The refusal of a URL by a format that writes local paths only."""
    return SerializationError(
        f"{where}: the {fmt.name!r} format writes local paths only (nothing was written); use "
        'format="orbax" (pip install jaxstruct-orbax) for remote storage, or give a local (or '
        "mounted) path"
    )


def _several_processes() -> bool:
    """Whether this is a multi-process JAX run (no, when JAX is not even imported).

    (``_multihost.process_count`` asks the same; asked here, a single-process export
    never enters ``_multihost``, which only the routes of several processes need.)
    """
    if "jax" not in sys.modules:
        return False
    import jax  # (being imported by another thread: waits for it, as an import does)

    return jax.process_count() > 1


class Publication:
    """How one export puts its checkpoint at ``path``, decided before anything is encoded.

    Args:
        path: the user's path: a local path (made absolute), or a URL string.
        fmt: the format writing it.
        overwrite: whether a checkpoint of ``fmt`` already there may be replaced.
        own: whether ``fmt`` is one of jaxstruct-io's own formats (a disk error its
            ``write`` meets is reported as the disk's, not as the format's failure).

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        SerializationError: ``path`` exists and is not a checkpoint of ``fmt``, or is
            a URL ``fmt`` cannot write or replace.
    """

    def __init__(self, path: str | os.PathLike[str], fmt: Format, overwrite: bool, own: bool):
        text = os.fspath(path)
        if not isinstance(text, str):
            raise TypeError(f"export() expected a str or os.PathLike path, got {path!r}")
        self.target: Any = text if URL.match(text) else Path(text).absolute()
        if isinstance(self.target, str) and not fmt.remote_paths:
            raise local_paths_only(repr(text), fmt)
        self.fmt = fmt
        self.overwrite = overwrite
        self.own = own
        self.where = repr(str(self.target))
        self.key = str(self.target)
        wait_for_previous(self.key)  # a new export to a path waits for the previous one
        step("start")
        several = _several_processes()
        #: Process 0 alone writes (a single-process format in a multi-process run).
        self.primary_only = several and not fmt.multiprocess
        if fmt.multiprocess and several:
            # Every process writes collectively: one that never comes is named here,
            # within the timeout, before any process starts writing.
            _multihost.barrier("export-start", path=self.where)
        # Whether our checkpoint is there (process 0 alone looks, when it writes, in a
        # primary-only run: it may already have published when the others would look).
        self.found = False if self.primary_only else self._refuse_existing()
        self._staging: _LocalStaging | _UrlStaging | None = None

    def write_failed(self, at: Any, err: BaseException) -> BaseException:
        """What export raises when the format's ``write`` at ``at`` raised ``err``: ours and
        interrupts as they are; a disk failure as a :class:`CheckpointWriteError` (naming a
        plugin's format); any other failure of a plugin's format as its failure."""
        fmt = self.fmt
        if not isinstance(err, Exception) or (
            isinstance(err, StructError) and not isinstance(err, OSError)
        ):
            return err
        kept = "; nothing was replaced"
        if not isinstance(err, OSError):
            return format_failed(fmt, "write", self.where, err, kept)
        if self.own:
            return write_error(self.target, err)
        if err.errno in _DISK_ERRNOS:
            return write_error(self.target, err, f"the {fmt.name!r} format ({source_of(fmt)})")
        return format_failed(fmt, "write", self.where, err, _outside(at, err) + kept)

    def refuse_unheld(self, arrays: Mapping[str, Any]) -> None:
        """Refuse arrays process 0 cannot write alone (a primary-only run)."""
        if self.primary_only:
            _multihost.check_primary_holds(arrays, self.fmt.name, self.where)

    # -- the two steps around the format's write ---------------------------------------

    def begin(self) -> Any:
        """Return where the format writes: a fresh temporary sibling, a staged sibling, or
        the URL itself; ``None`` when another process writes (a primary-only run)."""
        if self.primary_only:
            if not _multihost.is_primary():
                return None
            try:
                self.found = self._refuse_existing()
                return self._local_sibling()
            except BaseException as err:
                self._share(err)
                raise
        if not self.fmt.publishes_atomically:
            return self._local_sibling()
        if not self._staged():
            return self.target
        return self._stage()

    def checks_written(self, at: Any) -> bool:
        """Whether this process checks what the format wrote at ``at`` before it is
        published: a local path, which this process publishes (process 0, when several
        write collectively)."""
        if not isinstance(at, Path):
            return False
        return not self.fmt.publishes_atomically or _multihost.is_primary()

    def finish(self, at: Any, error: BaseException | None) -> None:
        """Publish what the format wrote at ``at`` (made durable, renamed into place, the
        old checkpoint deleted), or remove it after ``error``; raise the outcome, in every
        process alike (the others of a multi-process run fail as the writer failed)."""
        if self.primary_only:
            if at is not None:
                error = self._outcome(self._via_sibling, at, error)
            self._share(error)
        elif not self.fmt.publishes_atomically:
            self._via_sibling(at, error)
        elif self._staging is not None:
            self._publish_staged(at, error)
        else:  # in place: written where it goes
            if error is not None and not _multihost.is_primary():
                raise error  # another process's own failure: raised there at once
            self._share(error)
            step("published")
            step("done")

    def start(
        self, manifest: bytes, arrays: Mapping[str, Any], compression: str
    ) -> PendingWrite | None:
        """Start the format's own background write (taking its own copies of ``arrays``), or
        return ``None``: then the caller runs the write and :meth:`finish` in a thread."""
        fmt = self.fmt
        if (
            type(fmt).write_async is Format.write_async
            or self.primary_only
            or not fmt.publishes_atomically
            or self._replacing()
        ):
            return None
        if not isinstance(self.target, Path):
            # ``None``: it declined after all, and the caller runs the write in a thread.
            return fmt.write_async(
                self.target, manifest, arrays, compression=compression, step=step
            )
        staged = self._stage()
        try:
            pending = fmt.write_async(staged, manifest, arrays, compression=compression, step=step)
        except BaseException:
            self._discard(staged)
            raise
        if pending is None:  # declined: nothing was started; the caller stages its own
            self._discard(staged)
            self._staging = None
            return None
        return _StagedWrite(self, pending, staged)

    # -- is something there, and may it be replaced? -----------------------------------

    def _refuse_existing(self) -> bool:
        """Refuse an existing target that may not be replaced; return whether ours is there."""
        target, fmt = self.target, self.fmt
        if isinstance(target, str):
            if self.overwrite and not _replaces_at_urls(fmt):
                raise SerializationError(
                    f"{target!r}: the {fmt.name!r} format cannot replace a checkpoint at a URL "
                    '(overwrite=True); export to a new path, or use format="orbax"'
                )
            return False  # the format itself refuses an existing one; overwrite stages the new
        if not os.path.lexists(target):
            return False
        if not self.overwrite:
            raise FileExistsError(
                f"{str(target)!r} already exists; pass overwrite=True to replace it, or choose "
                "another path"
            )
        if not _ours(target, fmt):
            raise SerializationError(
                f"{str(target)!r} exists and is not a jaxstruct {fmt.name} checkpoint; "
                "overwrite=True only replaces checkpoints. Remove it yourself, or choose "
                "another path"
            )
        return True

    def _replacing(self) -> bool:
        return self.overwrite and (isinstance(self.target, str) or os.path.lexists(self.target))

    def _staged(self) -> bool:
        """Whether a self-publishing format writes at a staged sibling (see the module's
        docstring): at every local path, and at a URL when replacing."""
        return isinstance(self.target, Path) or self._replacing()

    # -- the sibling route -----------------------------------------------------------------

    def _local_sibling(self) -> Path:
        """A new temporary sibling of the local target, its parents made, the debris of
        finished writers swept, and what may not be replaced refused."""
        target: Path = self.target
        if not self.found:
            try:
                make_parents(target.parent)
            except OSError as err:
                raise write_error(target, err) from err
        sweep_debris(target, self.found)
        if not self.found:  # a parked checkpoint may have been recovered
            self.found = self._refuse_existing()
        return temp_sibling(target)

    def _via_sibling(self, tmp: Path, error: BaseException | None) -> None:
        """Make the temporary sibling durable, then swap it in so that a crash never loses
        the checkpoint already at the path (after ``error``: remove it, and raise)."""
        target: Path = self.target
        old: Path | None = None
        moved = False  # whether tmp is in place (then nothing of it is left to remove)
        try:
            if error is not None:
                raise error
            try:
                make_durable(tmp)
                step("temp-synced")
            except OSError as err:
                raise write_error(target, err) from err
            step("written")
            old = self._swap_in(tmp)
            moved = True
            # The swapped-out old checkpoint is deleted on the pool while the parent is
            # fsynced (both wait on the disk, which serves them together), and waited for.
            deleting = delete_soon(old) if old is not None else None
            try:
                fsync_dir(target.parent)
                step("published")
            finally:
                if deleting is not None:
                    deleting.result()
                    old = None
        finally:
            # On failure, the half-written temporary (or the old checkpoint, if a
            # failure came before its deletion). The target itself is never touched here.
            if old is not None:
                remove_old(old)
            elif not moved:
                remove_written(tmp)
        step("done")

    def _swap_in(self, tmp: Path) -> Path | None:
        """Put ``tmp`` at the target; return where the replaced checkpoint went, if any.
        Another writer's checkpoint appearing meanwhile is looked at as the first was."""
        target = self.target
        checked = self.found
        while True:
            if os.path.lexists(target):
                if not checked:
                    self._refuse_existing()  # someone else created it during this export
                try:
                    return exchange(tmp, target)
                except FileNotFoundError:
                    continue  # it vanished again: publish as new
                except FileExistsError:
                    checked = False  # another writer published meanwhile: check it, swap again
                    continue
            try:
                rename_noreplace(tmp, target)
                return None
            except FileExistsError:
                if not self.overwrite:
                    raise FileExistsError(
                        f"{str(target)!r} was created by someone else during this export; "
                        "pass overwrite=True to replace it"
                    ) from None
                checked = False

    # -- several processes, and formats that publish themselves ----------------------------

    def _outcome(
        self, publish: Callable[[Any, BaseException | None], None], at: Any, error: Any
    ) -> BaseException | None:
        """Run ``publish``; return its failure instead of raising it."""
        try:
            publish(at, error)
        except BaseException as err:
            return err
        return None

    def _share(self, error: BaseException | None) -> None:
        """Share process 0's outcome with the others; raise it in every process."""
        _multihost.share_outcome(f"export-{self.fmt.name}", error, path=self.where)
        if error is not None:
            raise error

    def _stage(self) -> Any:
        """Process 0 names the staged sibling; every process returns it."""
        staging: _LocalStaging | _UrlStaging = (
            _UrlStaging(self.fmt.remote_directory(), self.target)
            if isinstance(self.target, str)
            else _LocalStaging(self)
        )
        error: BaseException | None = None
        name = ""
        if _multihost.is_primary():
            try:
                name = staging.stage()
            except BaseException as err:
                error = err
        _multihost.share_outcome("overwrite-stage", error, path=self.where)
        if error is not None:
            raise error
        self._staging = staging
        return staging.locate(_multihost.agree("overwrite-name", name, path=self.where))

    def _discard(self, staged: Any) -> None:
        if _multihost.is_primary() and self._staging is not None:
            self._staging.discard(staged)

    def _publish_staged(self, staged: Any, error: BaseException | None) -> None:
        """Process 0 publishes what every process wrote at ``staged`` (or discards it after
        ``error``, process 0's failure to write it); every process raises its outcome. A
        failure of another process is raised there at once."""
        primary = _multihost.is_primary()
        if error is not None and not primary:
            raise error
        staging = self._staging
        assert staging is not None
        if primary and error is None:
            try:
                staging.swap(staged)
                step("published")
            except BaseException as err:
                error = err
        elif primary:
            staging.discard(staged)
        _multihost.share_outcome("overwrite-publish", error, path=self.where)
        if error is not None:
            raise error
        step("done")


class _StagedWrite(PendingWrite):
    """A format's background write at a staged sibling, published when it is waited for."""

    def __init__(self, publication: Publication, pending: PendingWrite, staged: Any) -> None:
        self.publication = publication
        self.pending = pending
        self.staged = staged
        self._done = False

    def wait(self) -> None:
        error: BaseException | None = None
        try:
            self.pending.wait()
        except BaseException as err:
            error = err
        try:
            self.publication._publish_staged(self.staged, error)
        finally:
            self._done = True

    def done(self) -> bool:
        return self._done


class _LocalStaging:
    """A local checkpoint staged as a temporary sibling (named by process 0), then renamed
    into place, or swapped in (a checkpoint there, and ``overwrite=True``)."""

    def __init__(self, publication: Publication) -> None:
        self.publication = publication
        self.target: Path = publication.target

    def stage(self) -> str:
        return self.publication._local_sibling().name

    def locate(self, name: str) -> Path:
        return self.target.with_name(name)

    def swap(self, staged: Any) -> None:
        old: Path | None = None
        moved = False
        try:
            # A self-publishing format committed it in its own way; made durable here
            # all the same, as every format's output is, before it is renamed into place.
            make_durable(staged)
            old = self.publication._swap_in(staged)
            moved = True
            fsync_dir(self.target.parent)
        except FileExistsError:
            raise  # another writer published first, and this one may not replace it
        except OSError as err:
            raise write_error(self.target, err) from err
        finally:
            if old is not None:
                remove(old)
            elif not moved:
                remove_written(staged)

    def discard(self, staged: Any) -> None:
        remove_written(staged)


class _UrlStaging:
    """A replacement at a URL (no rename there): the format's remote directory stages the
    new checkpoint beside the old one and swaps it in (``url`` itself when nothing is there)."""

    def __init__(self, remote: Any, target: str) -> None:
        self.remote = remote
        self.target = target

    def stage(self) -> str:
        return self.remote.stage_replacement(self.target)

    def locate(self, name: str) -> str:
        return name

    def swap(self, staged: Any) -> None:
        if staged != self.target:
            self.remote.commit_replacement(staged, self.target)

    def discard(self, staged: Any) -> None:
        if staged != self.target:
            self.remote.delete_checkpoint(staged)


#: What a disk that failed or refused says: export reports a disk failure, even when a
#: plugin's write met it (naming the format).
_DISK_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EIO", "EFBIG", "EMFILE", "ENFILE",
        "ENOMEM",
    )
    if hasattr(errno, name)
)  # fmt: skip


def _outside(at: Any, err: OSError) -> str:
    """Words for a failure a format met at a path outside the temporary ``at`` it was given
    (that path is left: it may be the user's)."""
    name = err.filename
    if not isinstance(at, Path) or not isinstance(name, (str, bytes, os.PathLike)):
        return ""
    found = os.path.abspath(os.fsdecode(name))
    if os.path.commonpath([found, str(at)]) == str(at):
        return ""
    return (
        f", at {found!r}, outside the temporary {str(at)!r} it was given (a format's write() "
        f"creates only the path it is given; {found!r} was left as it is: remove it if it is "
        "not yours)"
    )


def owns_checkpoint(fmt: Format, path: Path) -> bool:
    """Whether ``path`` is a checkpoint of ``fmt``, which ``overwrite`` may replace.

    An ``owns`` that finds the file is not its own (one of our errors) says no; one
    that fails otherwise is the format's failure, raised as a ``SerializationError``
    naming it (nothing is replaced, and a sound file is not blamed).
    """
    try:
        return bool(fmt.owns(path))
    except StructError:
        return False
    except Exception as err:
        raise owns_failed(fmt, path, err) from err


def _ours(target: Path, fmt: Format) -> bool:
    """Whether the existing ``target`` is a checkpoint of ``fmt``. Swapped by another writer
    while it is looked at, it is looked at again (gone: then nothing of someone else's is
    replaced)."""
    seen: tuple[int, ...] | None = None
    for _ in range(4):
        if owns_checkpoint(fmt, target):
            return True
        now = identity(target, follow=False)
        if now is None:
            return True  # gone: publishing finds out and publishes as new
        if now == seen:
            return False  # the same file or directory, refused twice
        seen = now
    return False


def _replaces_at_urls(fmt: Format) -> bool:
    """Whether ``fmt`` can replace a checkpoint at a URL: it publishes atomically and its
    remote directory stages replacements."""
    remote = fmt.remote_directory() if fmt.publishes_atomically else None
    return remote is not None and (
        type(remote).stage_replacement is not RemoteDirectory.stage_replacement
    )
