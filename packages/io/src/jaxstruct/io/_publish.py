"""Publishing a checkpoint: where it may go, how it replaces the old one, in every process.

:class:`Publication` is the one path from "these bytes are encoded" to "the
checkpoint is at its path". It is made once per export, before anything is
encoded (an existing path that may not be replaced is refused there), and it
picks one of four routes from the format and the run:

- **sibling** (the built-in formats, and any format that does not publish
  atomically itself): the format writes a fresh temporary sibling, which is
  then renamed over the path (``renameat2`` or the two-rename fallback of
  ``_fs``); the old checkpoint is deleted after the swap.
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
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxstruct.registry import SerializationError

from . import _fs, _multihost
from ._detect import owns_checkpoint, write_checked
from ._formats import Format, PendingWrite, RemoteDirectory

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str) -> bool:
    """Return whether ``path`` looks like a URL (``gs://bucket/ck``, ``memory://x``)."""
    return _URL.match(path) is not None


def local_or_url(path: str | os.PathLike[str], what: str) -> Any:
    """``path`` as a :class:`~pathlib.Path`, or as the string of a URL."""
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"{what}() expected a str or os.PathLike path, got {path!r}")
    return text if is_url(text) else Path(text)


def local_paths_only(where: str, fmt: Format) -> SerializationError:
    """The refusal of a URL by a format that writes local paths only."""
    return SerializationError(
        f"{where}: the {fmt.name!r} format writes local paths only (nothing was written); use "
        'format="orbax" (pip install jaxstruct-orbax) for remote storage, or give a local (or '
        "mounted) path"
    )


class Publication:
    """How one export puts its checkpoint at ``target``, decided before anything is encoded.

    Args:
        target: an absolute :class:`~pathlib.Path`, or a URL string.
        fmt: the format writing it.
        overwrite: whether a checkpoint of ``fmt`` already there may be replaced.

    Raises:
        FileExistsError: ``target`` exists and ``overwrite`` is false.
        SerializationError: ``target`` exists and is not a checkpoint of ``fmt``, or
            is a URL ``fmt`` cannot replace.
    """

    def __init__(self, target: Any, fmt: Format, overwrite: bool) -> None:
        self.target = target
        self.fmt = fmt
        self.overwrite = overwrite
        self.where = repr(str(target))
        several = _multihost.process_count() > 1
        #: Process 0 alone writes (a single-process format in a multi-process run).
        self.primary_only = several and not fmt.multiprocess
        if fmt.multiprocess and several:
            # Every process writes collectively: one that never comes is named here,
            # within the timeout, before any process starts writing.
            _multihost.barrier("export-start", path=self.where)
        # Whether our checkpoint is there (process 0 alone looks, when it writes, in a
        # primary-only run: it may already have published when the others would look).
        self.found = False if self.primary_only else self._refuse_existing()

    # -- the one entry point -------------------------------------------------------

    def run(self, manifest: bytes, arrays: Mapping[str, Any], compression: str) -> None:
        """Write the checkpoint and publish it, in this thread (and every process)."""
        if self.primary_only:
            self._on_primary(manifest, arrays, compression)
        elif not self.fmt.publishes_atomically:
            self._via_sibling(manifest, arrays, compression)
        elif self._staged():
            self._replace(manifest, arrays, compression)
        else:
            self._in_place(manifest, arrays, compression)

    def start(
        self, manifest: bytes, arrays: Mapping[str, Any], compression: str
    ) -> PendingWrite | None:
        """Start the format's own background write (taking its own copies of ``arrays``), or
        return ``None``: then :meth:`run` is to be called in a thread on private copies."""
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
                self.target, manifest, arrays, compression=compression, step=_fs.step
            )
        staging, staged = self._stage()
        try:
            pending = fmt.write_async(
                staged, manifest, arrays, compression=compression, step=_fs.step
            )
        except BaseException:
            if _multihost.is_primary():
                staging.discard(staged)
            raise
        if pending is None:  # declined: nothing was started; run() stages its own
            if _multihost.is_primary():
                staging.discard(staged)
            return None
        return _StagedWrite(self, pending, staging, staged)

    def refuse_unheld(self, arrays: Mapping[str, Any]) -> None:
        """Refuse arrays process 0 cannot write alone (a primary-only run)."""
        if self.primary_only:
            _multihost.check_primary_holds(arrays, self.fmt.name, self.where)

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

    # -- the routes ----------------------------------------------------------------------

    def _on_primary(self, manifest: bytes, arrays: Mapping[str, Any], compression: str) -> None:
        """Process 0 checks the path and takes the sibling route; the others wait for its
        word and fail as it failed (they never look at the path themselves)."""
        error: BaseException | None = None
        if _multihost.is_primary():
            try:
                self.found = self._refuse_existing()
                self._via_sibling(manifest, arrays, compression)
            except BaseException as err:
                error = err
        _multihost.share_outcome(f"export-{self.fmt.name}", error, path=self.where)
        if error is not None:
            raise error

    def _local_sibling(self) -> Path:
        """A new temporary sibling of the local target, its parents made, the debris of
        finished writers swept, and what may not be replaced refused."""
        target: Path = self.target
        if not self.found:
            try:
                _fs.make_parents(target.parent)
            except OSError as err:
                raise _fs.write_error(target, err) from err
        _fs.sweep_debris(target, self.found)
        if not self.found:  # a parked checkpoint may have been recovered
            self.found = self._refuse_existing()
        return _fs.temp_sibling(target)

    def _via_sibling(self, manifest: bytes, arrays: Mapping[str, Any], compression: str) -> None:
        """Write a temporary sibling, then swap it in so that a crash never loses the
        checkpoint already at the path."""
        target: Path = self.target
        tmp = self._local_sibling()
        old: Path | None = None
        moved = False  # whether tmp is in place (then nothing of it is left to remove)
        try:
            try:
                write_checked(
                    self.fmt,
                    tmp,
                    manifest,
                    arrays,
                    compression,
                    publishing=True,
                    replacing=self.found,
                )
            except OSError as err:
                raise _fs.write_error(target, err) from err
            _fs.step("written")
            old = self._swap_in(tmp)
            moved = True
            # The swapped-out old checkpoint is deleted on the pool while the parent is
            # fsynced (both wait on the disk, which serves them together), and waited for.
            deleting = _fs.delete_soon(old) if old is not None else None
            try:
                _fs.fsync_dir(target.parent)
                _fs.step("published")
            finally:
                if deleting is not None:
                    deleting.result()
                    old = None
        finally:
            # On failure, the half-written temporary (or the old checkpoint, if a
            # failure came before its deletion). The target itself is never touched here.
            if old is not None:
                _fs.remove_old(old)
            elif not moved:
                _fs.remove(tmp)
        _fs.step("done")

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
                    return _fs.exchange(tmp, target)
                except FileNotFoundError:
                    continue  # it vanished again: publish as new
                except FileExistsError:
                    checked = False  # another writer published meanwhile: check it, swap again
                    continue
            try:
                _fs.rename_noreplace(tmp, target)
                return None
            except FileExistsError:
                if not self.overwrite:
                    raise FileExistsError(
                        f"{str(target)!r} was created by someone else during this export; "
                        "pass overwrite=True to replace it"
                    ) from None
                checked = False

    def _in_place(self, manifest: bytes, arrays: Mapping[str, Any], compression: str) -> None:
        """A self-publishing format writes at the target itself, in every process."""
        error = self._write_collectively(self.target, manifest, arrays, compression, False)
        _multihost.share_outcome(f"export-{self.fmt.name}", error, path=self.where)
        if error is not None:
            raise error
        _fs.step("published")
        _fs.step("done")

    def _replace(self, manifest: bytes, arrays: Mapping[str, Any], compression: str) -> None:
        """A self-publishing format at a staged sibling: process 0 stages it, every process
        writes it (a multi-process format writes collectively), then process 0 publishes it."""
        staging, staged = self._stage()
        error = self._write_collectively(staged, manifest, arrays, compression, True)
        self._publish_staged(staging, staged, error)

    def _stage(self) -> tuple[Any, Any]:
        """Process 0 names the staged sibling; every process returns it (and its staging)."""
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
        return staging, staging.locate(_multihost.agree("overwrite-name", name, path=self.where))

    def _publish_staged(self, staging: Any, staged: Any, error: BaseException | None) -> None:
        """Process 0 publishes what every process wrote at ``staged`` (or discards it after
        ``error``, process 0's failure to write it); every process raises its outcome."""
        primary = _multihost.is_primary()
        if primary and error is None:
            try:
                staging.swap(staged)
                _fs.step("published")
            except BaseException as err:
                error = err
        elif primary:
            staging.discard(staged)
        _multihost.share_outcome("overwrite-publish", error, path=self.where)
        if error is not None:
            raise error
        _fs.step("done")

    def _write_collectively(
        self,
        path: Any,
        manifest: bytes,
        arrays: Mapping[str, Any],
        compression: str,
        publishing: bool,
    ) -> BaseException | None:
        """Write at ``path`` in every process; return process 0's failure (for the caller to
        share with the others before raising it), raise another's at once.

        Only process 0 checks what was written: it alone publishes, and the others may
        look only after it has (a temporary sibling is gone by then).
        """
        check = _multihost.is_primary()
        try:
            write_checked(
                self.fmt,
                path,
                manifest,
                arrays,
                compression,
                publishing=publishing,
                check=check,
                replacing=publishing and self.found,
            )
        except BaseException as err:
            if not isinstance(err, OSError):
                if not check:
                    raise
                return err
            error = _fs.write_error(self.target, err)
            error.__cause__ = err
            if not check:
                raise error from err
            return error
        return None


class _StagedWrite(PendingWrite):
    """A format's background write at a staged sibling, published when it is waited for."""

    def __init__(
        self, publication: Publication, pending: PendingWrite, staging: Any, staged: Any
    ) -> None:
        self.publication = publication
        self.pending = pending
        self.staging = staging
        self.staged = staged
        self._done = False

    def wait(self) -> None:
        error: BaseException | None = None
        try:
            self.pending.wait()
        except BaseException as err:
            if not _multihost.is_primary():  # as _write_collectively: raised here at once
                self._done = True
                raise
            error = err
        try:
            self.publication._publish_staged(self.staging, self.staged, error)
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
            old = self.publication._swap_in(staged)
            moved = True
            _fs.fsync_dir(self.target.parent)
        except FileExistsError:
            raise  # another writer published first, and this one may not replace it
        except OSError as err:
            raise _fs.write_error(self.target, err) from err
        finally:
            if old is not None:
                _fs.remove(old)
            elif not moved:
                _fs.remove(staged)

    def discard(self, staged: Any) -> None:
        _fs.remove(staged)


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


def _ours(target: Path, fmt: Format) -> bool:
    """Whether the existing ``target`` is a checkpoint of ``fmt``. Swapped by another writer
    while it is looked at, it is looked at again (gone: then nothing of someone else's is
    replaced)."""
    seen: tuple[int, ...] | None = None
    for _ in range(4):
        if owns_checkpoint(fmt, target):
            return True
        now = _fs.identity(target, follow=False)
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
