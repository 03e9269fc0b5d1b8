"""Checkpoints on disk: :func:`export` and :func:`load`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jaxstruct.registry import SerializationError

from . import _atomic
from ._decode import Resolver, decode_state
from ._encode import encode_state
from ._formats import Format, OpenedCheckpoint
from ._limits import Limits, limits_from_kwargs
from ._manifest import check_arrays_table, dump_manifest, parse_manifest
from ._plugins import current_registry

__all__ = ["export", "is_checkpoint", "load", "open_checkpoint"]

_COMPRESSIONS = ("auto", "deflate", "none")


def _format_for_export(path: Path) -> Format:
    formats = current_registry().formats
    suffix = path.suffix.lower()
    for fmt in formats.values():
        if suffix and suffix in fmt.suffixes:
            return fmt
    return formats["directory"]


def _detect(path: Path) -> Format:
    where = repr(str(path))
    if not os.path.exists(path):
        raise FileNotFoundError(f"{where}: no such checkpoint")
    is_dir = path.is_dir()
    if not is_dir and not path.is_file():
        raise SerializationError(f"{where}: is not a regular file or directory")
    for fmt in current_registry().formats.values():
        if fmt.is_directory != is_dir:
            continue
        try:
            if fmt.sniff(path):
                return fmt
        except OSError:
            continue
    kind = "directory" if is_dir else "file"
    raise SerializationError(
        f"{where}: this {kind} is not a checkpoint of any registered format "
        f"({sorted(current_registry().formats)})"
    )


def open_checkpoint(path: Path, limits: Limits) -> tuple[Format, OpenedCheckpoint, dict[str, Any]]:
    """Detect the format of ``path``, open it and parse its manifest (arrays are not read)."""
    fmt = _detect(path)
    where = repr(str(path))
    opened = fmt.open(path, limits)
    try:
        top = parse_manifest(opened.manifest, where)
        if top["container"] != fmt.name and top["container"] not in getattr(fmt, "also_reads", ()):
            raise SerializationError(
                f"{where}: the manifest says container {top['container']!r} but the file is a "
                f"{fmt.name!r} checkpoint"
            )
    except BaseException:
        opened.close()
        raise
    return fmt, opened, top


def is_checkpoint(path: Path, fmt: Format) -> bool:
    """Return whether ``path`` is a readable jaxstruct checkpoint of format ``fmt``."""
    try:
        found, opened, _ = open_checkpoint(path, Limits())
    except (SerializationError, OSError):
        return False
    opened.close()
    return found.name == fmt.name


def export(
    obj: Any, path: str | os.PathLike[str], *, overwrite: bool = False, compression: str = "auto"
) -> Path:
    """Write ``obj`` to disk as a checkpoint, atomically.

    A path ending in ``.zip`` gives one zip archive; any other path a
    directory holding ``manifest.json`` and ``arrays.npz``. The checkpoint is
    written to a temporary sibling, fsynced and then renamed into place, so a
    crash at any point leaves the previous checkpoint intact.

    Args:
        obj: the value to store.
        path: target path.
        overwrite: replace an existing checkpoint (only a jaxstruct checkpoint
            of the same format is ever replaced).
        compression: ``"auto"`` deflates array members that shrink and stores
            the others; ``"deflate"`` always deflates; ``"none"`` never does.

    Returns:
        The path written, as a :class:`pathlib.Path`.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        SerializationError: a value cannot be represented (nothing is written),
            or ``overwrite=True`` would replace something that is not a
            jaxstruct checkpoint.
        CheckpointWriteError: the disk failed while writing (full, read-only,
            ...); the previous checkpoint is left in place. It is an ``OSError``
            with the original ``errno``, and a :class:`SerializationError`.

    Example:
        >>> import tempfile, numpy as np
        >>> target = Path(tempfile.mkdtemp()) / "ckpt.zip"
        >>> export({"w": np.ones(2)}, target).name
        'ckpt.zip'
        >>> load(target)
        {'w': array([1., 1.])}
    """
    if compression not in _COMPRESSIONS:
        raise SerializationError(
            f"compression must be one of {list(_COMPRESSIONS)}, got {compression!r}"
        )
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite expected a bool, got {overwrite!r}")
    target = Path(os.fspath(path)).absolute()
    _atomic.step("start")
    fmt = _format_for_export(target)
    if os.path.lexists(target) and not overwrite:
        raise FileExistsError(
            f"{str(target)!r} already exists; pass overwrite=True to replace it, or choose "
            "another path"
        )
    # Encode everything before touching the disk: an unrepresentable value
    # fails here and nothing is written.
    state = encode_state(obj)
    manifest = dump_manifest(state, fmt.name)
    _atomic.step("encoded")
    _atomic.publish(
        target,
        lambda tmp: fmt.write(
            tmp, manifest, state["array_data"], compression=compression, step=_atomic.step
        ),
        overwrite=overwrite,
        is_ours=getattr(fmt, "owns", None) or (lambda existing: is_checkpoint(existing, fmt)),
        what=f"{fmt.name} checkpoint",
    )
    return target


def load(
    path: str | os.PathLike[str],
    *,
    load_cls: Any = None,
    allow_imports: Iterable[str] = (),
    **limits: int,
) -> Any:
    """Read a checkpoint written by :func:`export`.

    Loading never imports a module (except those listed in
    ``allow_imports``) and never unpickles; every limit is checked before the
    memory it guards is allocated.

    Args:
        path: a checkpoint directory or ``.zip`` archive.
        load_cls: the expected class of the root value (also used to resolve
            the root's class reference), or a mapping ``{"module:Qual": cls}``.
        allow_imports: module names (or package prefixes) that may be
            imported to find classes.
        **limits: ``max_manifest_bytes=``, ``max_depth=``, ``max_nodes=``,
            ``max_array_bytes=``, ``max_inflation_ratio=`` raise those limits.

    Returns:
        The stored value.

    Raises:
        FileNotFoundError: nothing exists at ``path``.
        SerializationError: the checkpoint is malformed, exceeds a limit, or
            names a class this process may not use; the message says which.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "ckpt"
        >>> _ = export({"step": 3}, target)
        >>> load(target)
        {'step': 3}
    """
    lim = limits_from_kwargs("load", limits)
    resolver = Resolver(load_cls, allow_imports)
    target = Path(os.fspath(path))
    where = repr(str(target))
    _, opened, top = open_checkpoint(target, lim)
    try:
        manifest = top["manifest"]
        if not isinstance(manifest, dict) or set(manifest) != {"root", "nodes"}:
            raise SerializationError(
                f"{where}: 'manifest' must be an object with 'root' and 'nodes'"
            )
        table = check_arrays_table(top["arrays"], where, lim)
        arrays = opened.read_arrays(table)
    finally:
        opened.close()
    return decode_state(manifest, table, arrays, resolver=resolver, limits=lim, source=where)
