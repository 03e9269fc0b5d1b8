"""Pausing Python's cyclic garbage collector while building many small acyclic objects."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["paused"]


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Keep the cyclic collector off inside the block (restoring its previous state).

    A checkpoint of 100,000 arrays makes a few objects per array (nodes,
    members, JSON pieces), none of them cyclic; the collector's passes over
    them cost more than building them.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
