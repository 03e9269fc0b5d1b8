"""Pausing Python's cyclic garbage collector while building many small acyclic objects."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

__all__ = ["paused"]

_lock = threading.Lock()
_holders = 0  # blocks inside paused(), in every thread
_restore = False  # whether the collector was on when the first of them entered


def _reset_in_child() -> None:
    """After a fork: a fresh lock, and no pause held by threads the child does not have.

    The collector is turned back on if a block had paused it (the child
    cannot tell whether the forking thread's own block is among them; such a
    block then runs its rest with the collector on).
    """
    global _lock, _holders
    _lock = threading.Lock()
    if _holders:
        _holders = 0
        if _restore:
            gc.enable()


if hasattr(os, "register_at_fork"):  # pragma: no branch - every POSIX platform
    os.register_at_fork(after_in_child=_reset_in_child)


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
            if _holders:  # zero when a fork reset the count inside this block
                _holders -= 1
                if _holders == 0 and _restore:
                    gc.enable()
