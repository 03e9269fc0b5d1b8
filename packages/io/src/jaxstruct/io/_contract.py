"""The format contract, checked: what a format's ``write`` made must be what it declares.

A plugin format's bug must cost its user no checkpoint: before the temporary a
format wrote is published, it must exist, be a directory exactly when the
format declares ``is_directory``, and be recognised by the format's own
``sniff``; an exception of the format's own becomes a ``SerializationError``
naming the format.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxstruct.registry import SerializationError, StructError

from . import _atomic
from ._detect import BUILTIN_TYPES, sniffs, source_of
from ._formats import Format

__all__ = ["check_written", "write_checked"]


def write_checked(
    fmt: Format,
    target: Any,
    manifest: bytes,
    arrays: Mapping[str, Any],
    compression: str,
    *,
    publishing: bool,
) -> None:
    """Call ``fmt.write`` and check what it made against the format contract.

    A plugin's own exception becomes a :class:`SerializationError` naming the
    format (with the exception chained); ``OSError`` and our own errors pass
    through. ``publishing``: ``target`` is a temporary the library publishes
    afterwards, so a format that made nothing, or the wrong kind of thing, is
    refused before the previous checkpoint is touched.
    """
    try:
        fmt.write(target, manifest, arrays, compression=compression, step=_atomic.step)
    except (OSError, StructError):
        raise
    except Exception as err:
        raise SerializationError(
            f"{str(target)!r}: the {fmt.name!r} format ({source_of(fmt)}) failed in write() "
            f"({type(err).__name__}: {err}); nothing was replaced"
        ) from err
    if type(fmt) in BUILTIN_TYPES or not isinstance(target, Path):
        return
    check_written(fmt, target, publishing=publishing)


def check_written(fmt: Format, path: Path, *, publishing: bool) -> None:
    """Refuse what a format's ``write`` made at ``path`` if it breaks the contract.

    It must exist, be a directory exactly when the format declares
    ``is_directory`` (a regular file otherwise), and be recognised by the
    format's own ``sniff`` (when it has one).

    Raises:
        SerializationError: naming the format and what is wrong.
    """
    who = f"the {fmt.name!r} format ({source_of(fmt)})"
    kept = "; nothing was replaced" if publishing else ""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise SerializationError(
            f"{str(path)!r}: {who} returned from write() without creating the checkpoint"
            f"{kept}; a format's write() must create the path it is given"
        ) from None
    made = "directory" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "special file"
    declared = "directory" if fmt.is_directory else "file"
    if made != declared:
        raise SerializationError(
            f"{str(path)!r}: {who} declares is_directory={fmt.is_directory}, but its write() "
            f"created a {made}{kept}; the format must create a {declared} (or declare "
            f"is_directory={not fmt.is_directory})"
        )
    if type(fmt).sniff is not Format.sniff and not sniffs(fmt, path):
        raise SerializationError(
            f"{str(path)!r}: {who} does not recognise (sniff) what its own write() created"
            f"{kept}; sniff() must recognise a checkpoint by its content, whatever its name"
        )
