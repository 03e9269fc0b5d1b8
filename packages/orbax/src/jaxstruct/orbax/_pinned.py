"""Whether a local checkpoint was replaced (``overwrite=True`` elsewhere) while it was read.

Orbax and tensorstore open a checkpoint's items by path, one after the other; an
overwrite swapping the directory meanwhile would pair one export's manifest with
another's arrays. The directory's identity is taken before the first read and
compared after the last: a swapped checkpoint is our error, never a mix.
"""

from __future__ import annotations

import os
from typing import Any

from jaxstruct.registry import SerializationError

__all__ = ["check_unchanged", "pin"]


def pin(path: Any) -> tuple[int, int, int] | None:
    """The identity of the local directory ``path`` (``None``: a URL, or nothing there)."""
    if not isinstance(path, os.PathLike) or str(path).startswith(("gs:", "s3:")):
        return None
    try:
        st = os.stat(os.fspath(path))
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def check_unchanged(path: Any, pinned: tuple[int, int, int] | None, where: str) -> None:
    """Raise our error when ``path`` is no longer the directory ``pinned`` was taken of."""
    if pinned is not None and pin(path) != pinned:
        raise SerializationError(
            f"{where}: the checkpoint was replaced (an export with overwrite=True) while it "
            "was being read, so nothing of it is returned; load it again"
        )
