"""Non-blocking export: a handle on a background write, and private copies of its arrays.

(One write per path at a time is ``_publish``'s: a new export to a path waits for the
handle of the previous one.)"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from jaxstruct.registry import SerializationError, StructError

from . import _host
from ._formats import PendingWrite, host_array
from ._publish import register, unregister


class ExportHandle:
    """A checkpoint being written in the background by ``export(..., blocking=False)``.

    The checkpoint appears at :attr:`path` atomically when the write
    finishes; until then the path holds the previous checkpoint (or nothing).

    Attributes:
        path: the checkpoint's path (a :class:`pathlib.Path`, or the URL string
            of a remote path).

    Example:
        >>> import tempfile, numpy as np
        >>> from pathlib import Path
        >>> import jaxstruct.io as jio
        >>> handle = jio.export({"w": np.ones(3)}, Path(tempfile.mkdtemp()) / "ck", blocking=False)
        >>> handle.wait()
        >>> handle.done(), jio.load(handle.path)["w"].tolist()
        (True, [1.0, 1.0, 1.0])
    """

    def __init__(self, path: Any, key: str) -> None:
        self.path = path
        self._key = key
        self._finished = threading.Event()
        self._error: BaseException | None = None

    def _start(self, work: Callable[[], PendingWrite | None]) -> None:
        """Run ``work`` (the write, then the publication) in a thread of its own."""
        register(self._key, self._finished)

        def run() -> None:
            try:
                pending = work()
                if pending is not None:
                    pending.wait()
            except BaseException as err:  # re-raised by wait()
                self._error = err
            finally:
                self._finished.set()
                unregister(self._key, self._finished)

        # In the caller's context: a registry used for a with block (PluginRegistry.using)
        # is the background write's too.
        context = contextvars.copy_context()
        threading.Thread(
            target=context.run, args=(run,), name="jaxstruct-export", daemon=False
        ).start()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the checkpoint is written; raise the background write's error if any.

        Args:
            timeout: seconds to wait at most (``None``: no limit).

        Raises:
            TimeoutError: the write did not finish within ``timeout``.
            SerializationError: the background write failed (as ``export`` would have).
        """
        if not self._finished.wait(timeout):
            raise TimeoutError(f"export to {str(self.path)!r} still running after {timeout} s")
        error = self._error
        if error is None:
            return
        if isinstance(error, (StructError, OSError)) or not isinstance(error, Exception):
            raise error
        raise SerializationError(
            f"export to {str(self.path)!r} failed in the background "
            f"({type(error).__name__}: {error}); nothing was replaced"
        ) from error

    def done(self) -> bool:
        """Return whether the background write has finished (successfully or not)."""
        return self._finished.is_set()

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"ExportHandle({str(self.path)!r}, {state})"


def host_copy(arr: Any) -> np.ndarray:
    """Return a private host copy of ``arr``, safe against later mutation or donation."""
    if isinstance(arr, np.ndarray):
        return arr.copy(order="K")
    out = host_array(arr)
    if out.flags.owndata or _host.streams(arr):
        # Assembled from pieces, or copied from accelerator memory through fresh device
        # arrays that nobody else holds: already private, and copied once only.
        return out
    # A CPU jax.Array may be viewed without a copy; donation would free that memory.
    return out.copy(order="K")
