"""Pausing Python's cyclic garbage collector while building many small acyclic objects."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["paused"]

_lock = threading.Lock()
_holders = 0  # blocks inside paused(), in every thread
_restore = False  # whether the collector was on when the first of them entered


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Keep the cyclic collector off inside the block (restoring its previous state).

    A checkpoint of 100,000 arrays makes a few objects per array (nodes,
    members, JSON pieces), none of them cyclic; the collector's passes over
    them cost more than building them. Blocks may overlap across threads (a
    background export beside a load): the collector comes back on when the
    last one leaves, and only if it was on when the first one entered.
    """
    global _holders, _restore
    with _lock:
        if _holders == 0:
            _restore = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _restore:
                gc.enable()
