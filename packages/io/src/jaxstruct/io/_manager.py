"""A directory of numbered checkpoints: async saves, restore, retention by age or by a metric."""

from __future__ import annotations

import json
import math
import operator
import os
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jaxstruct.registry import SerializationError

from . import _multihost
from ._async import ExportHandle
from ._export import export
from ._formats import Format, is_url
from ._load import format_named, load, sniffs
from ._multihost import PreemptionWatch
from ._publish import fsync_dir, local_paths_only, owns_checkpoint, remove, replace_file

_METRICS = ".metrics"
_TRASH = ".jaxstruct-deleting-"


def _step_number(step: Any) -> int:
    """``step`` as an int (integer scalars of NumPy or JAX included), checked non-negative."""
    try:
        number = operator.index(step) if not isinstance(step, bool) else -1
    except TypeError:
        number = -1
    if number < 0:
        raise SerializationError(f"save(): step must be a non-negative int, got {step!r}")
    return number


class CheckpointManager:
    """Save numbered checkpoints into one directory and restore them, keeping the best or newest.

    Every format works (``format=None`` is the directory format). Saves are
    asynchronous by default: :meth:`save` returns once the arrays are copied,
    and the next :meth:`save`, :meth:`restore` or :meth:`wait` waits for it.
    In a multi-process run, every process calls :meth:`save` and
    :meth:`restore` together; the primary process prunes.

    Args:
        directory: where the steps live (created if missing).
        keep: how many steps to keep (``None``: all). With ``best_metric``, the
            ``keep`` best steps are kept, plus always the newest one so training
            can resume.
        format: a registered format name (``"directory"``, ``"zip"``, ``"orbax"``, ...).
        best_metric: the key of ``metrics`` that ranks steps for retention.
        mode: ``"min"`` (lower is better) or ``"max"``.
        blocking: save synchronously instead.
        compression: passed to :func:`jaxstruct.io.export`.
        save_on_preemption: watch for a preemption notice (SIGTERM): see
            :meth:`reached_preemption`. In a single process a SIGTERM handler
            is installed until :meth:`close` (chained to the one it replaces);
            with ``jax.distributed``, JAX's preemption service is used instead.

    Example:
        >>> import tempfile, numpy as np
        >>> import jaxstruct.io as jio
        >>> manager = jio.CheckpointManager(tempfile.mkdtemp(), keep=2)
        >>> for step in range(4):
        ...     manager.save(step, {"w": np.full(2, step)})
        >>> manager.wait()
        >>> manager.all_steps(), manager.restore()["w"]
        ([2, 3], array([3, 3]))
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        keep: int | None = None,
        format: str | None = None,
        best_metric: str | None = None,
        mode: str = "min",
        blocking: bool = False,
        compression: str = "auto",
        save_on_preemption: bool = False,
    ) -> None:
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise SerializationError(
                f"CheckpointManager(): keep must be a positive int or None, got {keep!r}"
            )
        if mode not in ("min", "max"):
            raise SerializationError(
                f"CheckpointManager(): mode must be 'min' or 'max', got {mode!r}"
            )
        if best_metric is not None and not isinstance(best_metric, str):
            raise TypeError(f"best_metric expected a str, got {best_metric!r}")
        self._format = format_named(format or "directory")
        self.format = self._format.name
        text = os.fspath(directory)
        self._remote = self._format.remote_directory() if is_url(text) else None
        if is_url(text) and self._remote is None:
            raise local_paths_only(f"CheckpointManager({text!r})", self._format)
        self.directory: Any = text.rstrip("/") if self._remote else Path(text).absolute()
        self.keep = keep
        self.best_metric = best_metric
        self.mode = mode
        self.blocking = blocking
        self.compression = compression
        self._suffix = self._format.suffixes[0] if self._format.suffixes else ""
        self._pattern = re.compile(rf"^(0|[1-9][0-9]*){re.escape(self._suffix)}$")
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        error: BaseException | None = None
        if _multihost.is_primary() and self._remote is None:
            try:
                (self.directory / _METRICS).mkdir(parents=True, exist_ok=True)
                self._empty_trash()
            except (NotADirectoryError, FileExistsError):
                error = SerializationError(
                    f"CheckpointManager({str(self.directory)!r}): this path (or a folder "
                    "above it) is a file, not a directory; give the manager a directory of "
                    "its own, where it keeps one checkpoint per step"
                )
            except BaseException as err:  # told to the others, then raised here
                error = err
        _multihost.share_outcome("manager-init", error, path=repr(str(self.directory)))
        if error is not None:
            raise error
        what = f"CheckpointManager({str(self.directory)!r})"
        self._preemption = PreemptionWatch(what) if save_on_preemption else None

    # -- preemption ------------------------------------------------------------

    def reached_preemption(self, step: int) -> bool:
        """Return whether ``step`` must be saved now because the job is being preempted.

        Call it at every step (every process, with the same step numbers) and,
        when it returns true, :meth:`save` that step (it then waits for the
        commit) and stop: the value stays true. With ``jax.distributed`` every
        process gets true at the same step (JAX's preemption sync point).
        Always false without ``save_on_preemption=True``.
        """
        watch = self._preemption
        return watch is not None and watch.reached_at(_step_number(step))

    @property
    def preempted(self) -> bool:
        """Whether the step to save before a preemption was reached (or saved): stop training."""
        return self._preemption is not None and self._preemption.reached

    def close(self) -> None:
        """Wait for the pending save, then put back the SIGTERM handler (if one was installed)."""
        try:
            self.wait()
        finally:
            if self._preemption is not None:
                self._preemption.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- listing ---------------------------------------------------------------

    def _under(self, *names: str) -> Any:
        """The path of ``names`` inside the directory (a str at a URL)."""
        if self._remote is not None:
            return "/".join((self.directory, *names))
        return self.directory.joinpath(*names)

    def path_of(self, step: int) -> Any:
        """Return the checkpoint path of ``step`` (whether or not it exists; a str at a URL)."""
        return self._under(f"{step}{self._suffix}")

    def _metrics_path(self, step: int) -> Any:
        return self._under(_METRICS, f"{step}.json")

    def _numbered(self) -> list[int]:
        """The step numbers named in the directory, committed or not."""
        remote = self._remote
        try:
            names = os.listdir(self.directory) if remote is None else remote.names(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(match.group(1)) for name in names if (match := self._pattern.match(name)))

    def all_steps(self) -> list[int]:
        """Return the committed steps, ascending (at a URL: those with a commit marker)."""
        remote = self._remote
        steps = self._numbered()
        if remote is not None:
            return [s for s in steps if remote.committed(self.path_of(s))]
        # Only checkpoints of the format are steps: a user's own file or folder named
        # like one is never listed, restored or pruned.
        fmt = self._format
        if type(fmt).owns is Format.owns:  # the default opens each one: its sniff is enough
            return [s for s in steps if sniffs(fmt, self.path_of(s), [])]
        return [s for s in steps if owns_checkpoint(fmt, self.path_of(s))]

    def latest_step(self) -> int | None:
        """Return the newest committed step, or ``None`` when there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def metrics(self, step: int) -> dict[str, Any] | None:
        """Return the metrics saved with ``step``, or ``None`` if it was saved without."""
        path = self._metrics_path(step)
        try:
            text = path.read_text("utf-8") if self._remote is None else self._remote.read_text(path)
        except FileNotFoundError:
            return None
        if text is None:
            return None
        try:
            value = json.loads(text)  # NaN and Infinity included: a diverged loss is a metric
        except (ValueError, RecursionError):
            return None  # a damaged metrics file: the step has no metrics
        return value if isinstance(value, dict) else None

    def best_step(self) -> int | None:
        """Return the committed step with the best ``best_metric``, or ``None``."""
        ranked = self._ranked(self.all_steps())
        return ranked[0] if ranked else None

    # -- saving ----------------------------------------------------------------

    def save(self, step: int, obj: Any, *, metrics: Mapping[str, Any] | None = None) -> None:
        """Save ``obj`` as ``step`` (in the background unless ``blocking=True``).

        Args:
            step: a non-negative int (or integer scalar array), not already saved.
            obj: the value to store.
            metrics: JSON-serialisable numbers describing the step (for
                ``best_metric`` retention).

        Raises:
            FileExistsError: ``step`` is already saved.
            SerializationError: ``obj`` or ``metrics`` cannot be stored, or the
                previous background save failed (its error is raised here).
        """
        step = _step_number(step)
        self.wait()
        path = self.path_of(step)
        self._sweep_uncommitted()
        if step in self.all_steps() if self._remote is not None else os.path.lexists(path):
            raise FileExistsError(
                f"{str(path)!r}: step {step} is already saved; save a new step number"
            )
        if metrics is not None:  # first, so a listed step always has its metrics
            self._write_metrics(step, metrics)
        else:
            self._drop_metrics(step)  # left by an earlier save of this step that failed
        try:
            handle = export(
                obj, path, format=self.format, compression=self.compression, blocking=False
            )
        except BaseException:
            self._drop_metrics(step)
            raise
        self._finish_in_background(handle, step)
        if self.blocking or (self._preemption is not None and self._preemption.saving()):
            self.wait()  # before a preemption: committed before the loop stops

    def _write_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not isinstance(metrics, Mapping):
            raise TypeError(f"metrics expected a mapping, got {type(metrics).__name__}")
        try:
            text = json.dumps(dict(metrics), allow_nan=True, sort_keys=True)
        except (TypeError, ValueError) as err:
            raise SerializationError(
                f"save(): metrics must be JSON-serialisable numbers or strings ({err}); convert "
                "arrays with float()"
            ) from None
        if not _multihost.is_primary():
            return
        final = self._metrics_path(step)
        if self._remote is not None:  # one object, replaced whole
            self._remote.write_text(final, text)
            return
        final.parent.mkdir(exist_ok=True)  # (deleted by hand, say)
        replace_file(final, text.encode("utf-8"))

    def _drop_metrics(self, step: int) -> None:
        """Remove the metrics of ``step``: metrics exist only beside its checkpoint."""
        if not _multihost.is_primary():
            return
        if self._remote is not None:
            self._remote.remove(self._metrics_path(step))
        else:
            self._metrics_path(step).unlink(missing_ok=True)

    def _finish_in_background(self, handle: ExportHandle, step: int) -> None:
        def run() -> None:
            try:
                handle.wait()
            except BaseException as err:  # re-raised by wait()
                self._error = err
                try:
                    self._drop_metrics(step)
                except OSError:
                    pass
                return
            try:
                self._prune()
            except BaseException as err:
                self._error = err

        self._thread = threading.Thread(target=run, name="jaxstruct-manager", daemon=False)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the pending save (and its pruning); raise its error if it failed.

        Raises:
            TimeoutError: it did not finish within ``timeout`` seconds.
        """
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise TimeoutError(f"the save into {str(self.directory)!r} is still running")
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    # -- restoring -------------------------------------------------------------

    def restore(
        self,
        step: int | None = None,
        *,
        target: Any = None,
        select: Callable[[Any], Any] | None = None,
        **load_kwargs: Any,
    ) -> Any:
        """Load ``step`` (default: the newest) as :func:`jaxstruct.io.load` would.

        Raises:
            FileNotFoundError: there is no such step (or no step at all).
        """
        self.wait()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"{str(self.directory)!r}: no checkpoint saved yet")
        elif step not in self.all_steps():
            raise FileNotFoundError(
                f"{str(self.directory)!r}: no step {step!r}; the saved steps are {self.all_steps()}"
            )
        return load(self.path_of(step), target=target, select=select, **load_kwargs)

    # -- retention -------------------------------------------------------------

    def _ranked(self, steps: list[int]) -> list[int]:
        """``steps`` best first (by metric; steps without it last, newest first among ties)."""
        metric = self.best_metric
        if metric is None:
            return sorted(steps, reverse=True)
        sign = 1.0 if self.mode == "min" else -1.0

        def key(step: int) -> tuple[bool, float, int]:
            found = (self.metrics(step) or {}).get(metric)
            if isinstance(found, bool) or not isinstance(found, int | float) or math.isnan(found):
                return (True, 0.0, -step)
            return (False, sign * found, -step)

        return sorted(steps, key=key)

    def _prune(self) -> None:
        if self.keep is None or not _multihost.is_primary():
            return
        steps = self.all_steps()
        if len(steps) <= self.keep:
            return
        kept = set(self._ranked(steps)[: self.keep])
        kept.add(steps[-1])  # the newest step always stays, so training can resume
        for step in steps:
            if step not in kept:
                self._delete(step)

    def _sweep_uncommitted(self) -> None:
        """At a URL: remove what saves killed midway left (no save of ours is running)."""
        remote = self._remote
        if remote is None or not _multihost.is_primary():
            return
        for step in self._numbered():
            if not remote.committed(self.path_of(step)):
                self._delete(step)

    def _delete(self, step: int) -> None:
        if self._remote is not None:  # the commit marker first: unlisted at once
            self._remote.delete_checkpoint(self.path_of(step))
            self._remote.remove(self._metrics_path(step))
            return
        path = self.path_of(step)
        trash = self.directory / f".{path.name}{_TRASH}{os.getpid()}"
        try:
            os.rename(path, trash)  # gone from the listing at once
        except FileNotFoundError:
            return
        fsync_dir(self.directory)
        self._metrics_path(step).unlink(missing_ok=True)
        remove(trash)

    def _empty_trash(self) -> None:
        for name in os.listdir(self.directory):
            if _TRASH in name:
                remove(self.directory / name)

    def __repr__(self) -> str:
        return (
            f"CheckpointManager({str(self.directory)!r}, format={self.format!r}, "
            f"steps={self.all_steps()})"
        )
