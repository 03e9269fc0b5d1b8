"""Checkpoints on disk, written: :func:`export`, step by step.

``export`` reads as the steps of the docs' "What happens on export"
(docs/contributing.md): choose the format, prepare the publication (an existing
path that may not be replaced is refused before anything is encoded), encode the
value, write it to a temporary with the format, check what a plugin's format
wrote, publish it (``_publish``: durable, renamed into place).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, overload

from jaxstruct.registry import SerializationError

from . import _async
from ._async import ExportHandle
from ._checksums import checksum_arrays
from ._contract import check_written
from ._encode import dump_manifest, encode_state
from ._formats import Format, PendingWrite
from ._plugins import current_registry
from ._publish import Publication, step
from ._schema import BY_FORMAT

_COMPRESSIONS = ("auto", "deflate", "none")

#: Suffixes of well-known single-file formats: a path ending in one that no
#: registered format claims is refused instead of becoming a directory.
FILE_SUFFIXES = frozenset(
    {
        ".bin", ".ckpt", ".gz", ".h5", ".hdf5", ".json", ".msgpack", ".nc", ".npy", ".npz",
        ".onnx", ".pickle", ".pkl", ".pt", ".pth", ".safetensors", ".tar", ".tgz", ".xz",
        ".zst",
    }
)  # fmt: skip


@overload
def export(
    obj: Any,
    path: str | os.PathLike[str],
    *,
    format: str | None = ...,
    overwrite: bool = ...,
    compression: str = ...,
    blocking: Literal[True] = ...,
) -> Path: ...


@overload
def export(
    obj: Any,
    path: str | os.PathLike[str],
    *,
    format: str | None = ...,
    overwrite: bool = ...,
    compression: str = ...,
    blocking: Literal[False],
) -> ExportHandle: ...


def export(
    obj: Any,
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    overwrite: bool = False,
    compression: str = "auto",
    blocking: bool = True,
) -> Any:
    """Write ``obj`` to disk as a checkpoint, atomically.

    ``format`` names a registered format (``"directory"``, ``"zip"``,
    ``"orbax"`` with jaxstruct-orbax installed, or a plugin's). Without it, a
    path ending in ``.zip`` gives one zip archive, a path ending in a suffix a
    plugin format claims (``.tar`` with jaxstruct-plugin-tar) that format, and
    any other path a directory holding ``manifest.json`` and ``arrays.npz``,
    except that a suffix of a well-known file format no registered format
    claims (``.h5``, ``.safetensors``, ...) is refused
    (``jaxstruct.io.current_registry().suffixes`` lists the claimed ones). The checkpoint is
    written to a temporary sibling, fsynced and then renamed into place, so a
    crash at any point leaves the previous checkpoint intact.

    Sharded ``jax.Array`` values are written shard by shard, as they lie on
    the devices. In a multi-process run every process calls ``export``
    together; see the "Training at scale" guide.

    Args:
        obj: the value to store.
        path: target path; a URL (``gs://bucket/ck``) only for formats that
            accept remote paths.
        format: a registered format name, or ``None`` to choose by suffix.
        overwrite: replace an existing checkpoint (only a jaxstruct checkpoint
            of the same format is ever replaced).
        compression: ``"auto"`` deflates the array members whose sample
            shrinks to at most half (masks, zeros, integer tables) and stores
            the others (float weights, which deflate little and would load at
            the speed of one core inflating); ``"deflate"`` always deflates
            (in pieces, on every core); ``"none"`` never does.
        blocking: with ``False``, return an :class:`ExportHandle` as soon as
            the arrays are copied off the caller's buffers; the checkpoint
            appears when the background write finishes, and
            :meth:`ExportHandle.wait` raises its error, if any.

    Returns:
        The path written, as a :class:`pathlib.Path` (a remote path stays a
        string), or an :class:`ExportHandle` when ``blocking=False``.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        SerializationError: a value cannot be represented (nothing is written),
            ``format`` is unknown, the path's file suffix is claimed by no
            format, the path is a URL the format cannot write,
            ``overwrite=True`` would replace something that is not a jaxstruct
            checkpoint, or a plugin format failed or broke its contract (its
            ``write`` or ``owns`` raised, it created nothing or the wrong kind of
            thing; the message names the format, its plugin and distribution,
            what it wrote is removed and the previous checkpoint is left in place).
        CheckpointWriteError: the disk failed while writing (full, read-only,
            ...); the previous checkpoint is left in place. It is an ``OSError``
            with the original ``errno``, and a :class:`SerializationError`.
        PluginError: the format, suffix or a value's codec belongs to a plugin
            that failed to load, or to two plugins.

    Example:
        >>> import tempfile, numpy as np
        >>> from jaxstruct.io import load
        >>> target = Path(tempfile.mkdtemp()) / "ckpt.zip"
        >>> export({"w": np.ones(2)}, target).name
        'ckpt.zip'
        >>> load(target)
        {'w': array([1., 1.])}
    """
    _check_options(compression, overwrite, blocking)
    fmt, own = choose_format(path, format)
    publication = Publication(path, fmt, overwrite, own)  # refuses what it may not replace
    manifest, arrays = encode_value(obj, publication)
    if blocking:
        write_and_publish(publication, manifest, arrays, compression)
        return publication.target
    return write_in_background(publication, manifest, arrays, compression)


def _check_options(compression: str, overwrite: bool, blocking: bool) -> None:
    if compression not in _COMPRESSIONS:
        raise SerializationError(
            f"compression must be one of {list(_COMPRESSIONS)}, got {compression!r}"
        )
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite expected a bool, got {overwrite!r}")
    if not isinstance(blocking, bool):
        raise TypeError(f"blocking expected a bool, got {blocking!r}")


# -- 1. choose the format --------------------------------------------------------------


def choose_format(path: str | os.PathLike[str], name: str | None) -> tuple[Format, bool]:
    """The format ``export`` writes ``path`` in: ``name``'s, else the one claiming the
    path's suffix, else ``"directory"``; and whether it is one of jaxstruct-io's own.

    Raises:
        SerializationError: ``name`` is not a registered format, or the suffix is a
            well-known file format's that no registered format claims.
        PluginError: the name or suffix belongs to a plugin that failed, or to two.
    """
    registry = current_registry()
    if name is not None:
        if not isinstance(name, str):
            raise TypeError(f"format expected a str (a registered format name), got {name!r}")
        fmt = registry.format_named(name)
        if fmt is None:
            raise unknown_format(name, registry)
        return fmt, registry.is_own(fmt)
    text = os.fspath(path)
    suffix = Path(text).suffix.lower() if isinstance(text, str) else ""
    fmt = registry.format_for_suffix(suffix) if suffix else None
    if fmt is None and suffix in FILE_SUFFIXES:
        raise SerializationError(
            f"{text!r}: no registered format claims the suffix {suffix!r} (nothing was "
            f"written){suffix_hint(registry)}; install the plugin that provides it, pass "
            'format= a registered format, or pass format="directory" to write a '
            "directory checkpoint under this name"
        )
    if fmt is None:
        if suffix:
            registry.check_suffix(text, suffix)  # an installed plugin not loaded may claim it
        fmt = registry.format_named("directory")
        if fmt is None:  # pragma: no cover - blocked by hand
            raise unknown_format("directory", registry)
    return fmt, registry.is_own(fmt)


def unknown_format(name: str, registry: Any) -> SerializationError:
    """The refusal of ``format=name`` when no format of that name is registered."""
    hint = (
        "; install jaxstruct-orbax (pip install jaxstruct-orbax) to get it"
        if name == "orbax"
        else ""
    )
    more = registry.missing_hint()
    return SerializationError(
        f"format={name!r} is not a registered format (registered: "
        f"{sorted(registry.formats)}){hint}{'; ' + more if more else ''}"
    )


def suffix_hint(registry: Any) -> str:
    """Words listing the claimed suffixes, for a refusal of an unclaimed one."""
    claimed = sorted(registry.suffixes)
    more = registry.missing_hint()
    return f" (claimed: {', '.join(claimed)}){'; ' + more if more else ''}"


# -- 3. encode -------------------------------------------------------------------------


def encode_value(obj: Any, publication: Publication) -> tuple[bytes, dict[str, Any]]:
    """The manifest and the arrays of ``obj``, all encoded before the disk is touched: a
    value that cannot be represented fails here, and nothing is written.

    The manifest records how its arrays are checked: by the format itself (one that
    ``checks_arrays``: jaxstruct-io's own, safetensors, orbax), or by jaxstruct's CRC-32 of
    every piece of every array, computed here (step "checksum the arrays")."""
    state = encode_state(obj)
    arrays: dict[str, Any] = state["array_data"]
    publication.refuse_unheld(arrays)
    fmt = publication.fmt
    checksums = BY_FORMAT if fmt.checks_arrays else checksum_arrays(arrays, publication.where)
    manifest = dump_manifest(state, fmt.name, checksums)
    step("encoded")
    return manifest, arrays


# -- 4-6. write to a temporary, check it, publish it ---------------------------------------


def write_and_publish(
    publication: Publication, manifest: bytes, arrays: Mapping[str, Any], compression: str
) -> None:
    """Write the checkpoint where ``publication`` says, check a plugin's output, publish it
    (in this thread, and in every process of a multi-process run)."""
    at = publication.begin()
    error: BaseException | None = None
    if at is not None:  # None: another process writes
        try:
            write_temporary(publication, at, manifest, arrays, compression)
            if not publication.own and publication.checks_written(at):
                check_written(publication.fmt, at, manifest)
        except BaseException as err:
            error = err
    publication.finish(at, error)


def write_temporary(
    publication: Publication, at: Any, manifest: bytes, arrays: Mapping[str, Any], compression: str
) -> None:
    """The format's ``write`` at ``at``; its failure as ``export`` reports it."""
    fmt = publication.fmt
    try:
        fmt.write(at, manifest, arrays, compression=compression, step=step)
    except BaseException as err:
        failure = publication.write_failed(at, err)
        if failure is err:
            raise
        raise failure from err


def write_in_background(
    publication: Publication, manifest: bytes, arrays: Mapping[str, Any], compression: str
) -> ExportHandle:
    """``blocking=False``: the format's own background write, or :func:`write_and_publish`
    in a thread on private copies of the arrays (taken before this returns)."""
    handle = _async.ExportHandle(publication.target, publication.key)
    pending = publication.start(manifest, arrays, compression)
    if pending is not None:  # the format's own background write took its own copies
        work: Callable[[], PendingWrite | None] = lambda: pending
    else:
        # Copy what the caller may change or donate now, and write from those
        # private copies in a background thread.
        copies = {k: _async.host_copy(v) for k, v in arrays.items()}
        work = functools.partial(write_and_publish, publication, manifest, copies, compression)
    handle._start(work)
    return handle
