"""Process-wide limits of orbax and tensorstore: one save at a time, none in a forked child.

* orbax numbers each save with one process-wide operation id and keys its
  signals by it, so two saves started together in one process (two threads)
  read each other's signals and one fails midway: saves start one at a time.
* tensorstore aborts a process forked from one where it had run, at its first
  operation there (its fork detection), killing the child with no error to
  catch: such a child gets our error instead, before tensorstore is touched.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from jaxstruct.io import at_fork
from jaxstruct.registry import SerializationError

__all__ = ["one_save_at_a_time", "refuse_in_forked_child", "tensorstore_ran"]

_saving = threading.Lock()
_ran = False  # whether tensorstore ran in this process through the format
_forked_after_run = False  # whether this process was forked from one where it had


@contextlib.contextmanager
def one_save_at_a_time() -> Iterator[None]:
    """Hold the process's save lock while an orbax save starts (or, blocking, runs)."""
    with _saving:
        yield


def tensorstore_ran() -> None:
    """Record that the format ran tensorstore here (a forked child may no longer)."""
    global _ran
    _ran = True


def refuse_in_forked_child(where: str) -> None:
    """Raise our error in a child forked after the format ran tensorstore in its parent."""
    if _forked_after_run:
        raise SerializationError(
            f"{where}: the orbax format cannot run in this process: it was forked "
            "(os.fork, or multiprocessing's 'fork' start method) from one where the format "
            "had already run, and tensorstore, which orbax reads and writes with, aborts "
            "such a process. Export or load in the parent, or start the worker with "
            "multiprocessing's 'spawn' or 'forkserver' start method"
        )


@at_fork  # jaxstruct-io's one fork handler runs it in every forked child
def _in_child() -> None:
    global _saving, _forked_after_run
    _saving = threading.Lock()  # a thread of the parent may have held it
    _forked_after_run = _forked_after_run or _ran
