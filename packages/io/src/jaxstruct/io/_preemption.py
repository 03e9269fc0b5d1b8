"""Noticing a preemption (SIGTERM) and agreeing on the step to save before stopping.

With ``jax.distributed`` the preemption service of JAX already catches
SIGTERM in every process (in C++), tells the others, and picks one step that
every process reaches: :func:`jax.experimental.multihost_utils.reached_preemption_sync_point`.
Then no handler of ours is installed (it would hide the signal from JAX).

In a single process, a SIGTERM handler is installed while a
:class:`PreemptionWatch` is open, and only then: it records the notice and
calls the handler it replaced when that one is a Python function; closing
the watch puts the replaced handler back. A process forked while the watch is
open does not inherit the notice, and a SIGTERM received there goes to the
replaced handler (or ends the child, as the default would).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import weakref
from typing import Any

from jaxstruct.registry import SerializationError

from ._jax_private import distributed_state

__all__ = ["PreemptionWatch"]

_open: weakref.WeakSet[PreemptionWatch] = weakref.WeakSet()


def _forget_in_child() -> None:
    for watch in list(_open):
        watch._noticed = False


os.register_at_fork(after_in_child=_forget_in_child)


def _distributed() -> Any:
    """jax.distributed's state when it is initialised with several processes, else ``None``."""
    if "jax" not in sys.modules:
        return None
    import jax

    if jax.process_count() == 1:
        return None
    return distributed_state()


class PreemptionWatch:
    """Whether a preemption notice arrived, and whether this step is the one to save."""

    def __init__(self, what: str) -> None:
        self._noticed = False
        self._reached = False
        self._pid = os.getpid()
        self._previous: Any = None
        self._installed = False
        state = _distributed()
        if state is not None:
            if getattr(state, "preemption_sync_manager", None) is None:
                raise SerializationError(
                    f"{what}: save_on_preemption=True in a multi-process run needs JAX's "
                    "preemption service, which is off; leave jax_enable_preemption_service "
                    "on (the default) before jax.distributed.initialize()"
                )
            self._distributed = True
            return
        self._distributed = False
        if threading.current_thread() is not threading.main_thread():
            raise SerializationError(
                f"{what}: save_on_preemption=True installs a SIGTERM handler, which Python "
                "allows only in the main thread; create the manager there"
            )
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        _open.add(self)

    def _handle(self, signum: int, frame: Any) -> None:
        previous = self._previous
        if os.getpid() == self._pid:
            self._noticed = True
            if callable(previous):
                previous(signum, frame)
            return
        # A forked child: behave as if this handler were not there.
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    @property
    def noticed(self) -> bool:
        """Whether this process received a preemption notice (single process only)."""
        return self._noticed

    @property
    def reached(self) -> bool:
        """Whether :meth:`reached` returned true once: the loop should stop."""
        return self._reached

    def reached_at(self, step: int) -> bool:
        """Return whether ``step`` is the step to save before stopping (then always true).

        In a multi-process run every process must call it at every step, with
        the same step numbers; they all get true at the same step.
        """
        if self._reached:
            return True
        if self._distributed:
            from jax.experimental import multihost_utils

            self._reached = bool(multihost_utils.reached_preemption_sync_point(step))
        else:
            self._reached = self._noticed
        return self._reached

    def saving(self) -> bool:
        """Called by a save: whether it is the save before stopping (a notice arrived).

        In a single process a notice makes the next save the last one; in a
        multi-process run only :meth:`reached_at` decides.
        """
        if not self._distributed and self._noticed:
            self._reached = True
        return self._reached

    def close(self) -> None:
        """Put back the SIGTERM handler that was replaced (if this watch installed one)."""
        if not self._installed:
            return
        self._installed = False
        _open.discard(self)
        if os.getpid() != self._pid or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._handle:
            # ``None``: the replaced handler was not Python's; the default is all we can restore.
            previous = self._previous if self._previous is not None else signal.SIG_DFL
            signal.signal(signal.SIGTERM, previous)
