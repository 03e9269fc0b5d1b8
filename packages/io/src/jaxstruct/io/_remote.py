"""What :class:`CheckpointManager` needs from a format to keep its steps at a URL.

Object stores have no directories and no atomic rename, so the manager does
not use the file system there: the format that writes the URL (``orbax`` for
``gs://``) lists names, tells committed checkpoints (their commit marker,
written last) from a save that stopped midway, reads and writes small
objects, and deletes a checkpoint marker first. ``export(..., overwrite=True)``
at a URL stages the new checkpoint beside the old one and swaps it in
(:meth:`RemoteDirectory.stage_replacement`, :meth:`RemoteDirectory.commit_replacement`).
"""

from __future__ import annotations

__all__ = ["RemoteDirectory"]


class RemoteDirectory:
    """Operations on objects under URLs, given by :meth:`Format.remote_directory`."""

    def names(self, url: str) -> list[str]:
        """Return the names directly under ``url`` (``[]`` when there is none)."""
        raise NotImplementedError

    def committed(self, url: str) -> bool:
        """Return whether ``url`` holds a checkpoint whose commit marker exists."""
        raise NotImplementedError

    def read_text(self, url: str) -> str | None:
        """Return the text of the object ``url``, or ``None`` if it does not exist."""
        raise NotImplementedError

    def write_text(self, url: str, text: str) -> None:
        """Write the object ``url`` (replaced as a whole)."""
        raise NotImplementedError

    def remove(self, url: str) -> None:
        """Remove the object ``url`` if it exists."""
        raise NotImplementedError

    def delete_checkpoint(self, url: str) -> None:
        """Delete the checkpoint at ``url``: its commit marker first, then every object."""
        raise NotImplementedError

    def stage_replacement(self, url: str) -> str:
        """Return where a checkpoint replacing the one at ``url`` is written (process 0 only).

        ``url`` itself when nothing is there. A replacement interrupted midway is
        finished first, a staged one never committed is removed.

        Raises:
            SerializationError: something other than a committed checkpoint is at ``url``.
        """
        raise NotImplementedError

    def commit_replacement(self, staged: str, url: str) -> None:
        """Make the committed checkpoint at ``staged`` the one at ``url``, then remove
        ``staged``; at every instant, loading ``url`` gives the old or the new one."""
        raise NotImplementedError
