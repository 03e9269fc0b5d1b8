"""On-disk formats: the :class:`Format` interface and the two built-in formats.

``directory`` writes ``manifest.json`` next to ``arrays.npz``; ``zip`` writes
one archive holding ``manifest.json`` and the ``.npy`` members. Array members
are named ``<key>.npy``, so ``numpy.load(..., allow_pickle=False)`` reads them.
Publishing (temporary sibling, fsync, atomic rename) is not a format's job:
:func:`jaxstruct.io.export` hands each format a fresh path to create.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from ._limits import Limits

__all__ = ["DirectoryFormat", "Format", "OpenedCheckpoint", "ZipFormat"]

ArrayTable = Mapping[str, tuple[np.dtype, tuple[int, ...], int]]


class OpenedCheckpoint:
    """A checkpoint opened for reading: its manifest bytes, and its arrays on demand."""

    manifest: bytes

    def read_arrays(self, table: ArrayTable) -> dict[str, np.ndarray]:
        """Return every array of ``table`` (``key -> (dtype, shape, nbytes)``), checked."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the files."""


class Format:
    """Base class of on-disk formats; subclass it in a plugin and return an instance from
    ``jaxstruct_register_formats``.

    Attributes:
        name: unique name, recorded in the manifest's ``container`` entry.
        suffixes: path suffixes that select this format on export (``(".zip",)``).
        is_directory: whether a checkpoint of this format is a directory.

    Example:
        >>> ZipFormat().name, ZipFormat().suffixes
        ('zip', ('.zip',))
    """

    name: str = ""
    suffixes: tuple[str, ...] = ()
    is_directory: bool = False

    def write(
        self,
        target: Path,
        manifest: bytes,
        arrays: Mapping[str, np.ndarray],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        """Create ``target`` (which does not exist) holding ``manifest`` and ``arrays``, fsynced."""
        raise NotImplementedError

    def sniff(self, path: Path) -> bool:
        """Return whether ``path`` (an existing file or directory) looks like this format.

        The default claims nothing, so a write-only format never captures a load.
        """
        return False

    def open(self, path: Path, limits: Limits) -> OpenedCheckpoint:
        """Open ``path`` for reading, enforcing ``limits`` before allocating."""
        raise NotImplementedError


# The built-in formats live in ``_builtin``; importing them here keeps
# ``from ._formats import DirectoryFormat, ZipFormat`` working.
from ._builtin import DirectoryFormat, ZipFormat  # noqa: E402
