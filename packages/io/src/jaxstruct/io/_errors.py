"""Error types of the I/O layer (the shared ones live in ``jaxstruct.registry``)."""

from __future__ import annotations

from jaxstruct.registry import SerializationError

__all__ = ["CheckpointWriteError"]


class CheckpointWriteError(OSError, SerializationError):
    """Writing a checkpoint failed on disk; nothing was replaced.

    It carries the ``errno`` of the underlying ``OSError`` (``ENOSPC`` for a
    full disk), which is kept as its ``__cause__``.
    """
