"""Checkpoints on disk: :func:`export` and :func:`load`."""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, overload

from jaxstruct.registry import SerializationError

from . import _async, _atomic, _gc, _multihost
from ._async import ExportHandle
from ._builtin import DirectoryFormat
from ._decode import Resolver, decode_state
from ._encode import encode_state
from ._errors import CheckpointWriteError
from ._formats import ArraySpec, Format, OpenedCheckpoint, PendingWrite
from ._limits import Limits, limits_from_kwargs
from ._manifest import check_arrays_table, dump_manifest, parse_manifest
from ._plain import Rename, load_plain
from ._plugins import current_registry
from ._targets import match_target

__all__ = ["export", "is_checkpoint", "is_url", "load", "open_checkpoint"]

_COMPRESSIONS = ("auto", "deflate", "none")


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str) -> bool:
    """Return whether ``path`` looks like a URL (``gs://bucket/ck``, ``memory://x``)."""
    return _URL.match(path) is not None


def _format_named(name: str) -> Format:
    formats = current_registry().formats
    if not isinstance(name, str):
        raise TypeError(f"format expected a str (a registered format name), got {name!r}")
    fmt = formats.get(name)
    if fmt is None:
        hint = (
            "; install jaxstruct-orbax (pip install jaxstruct-orbax) to get it"
            if name == "orbax"
            else ""
        )
        raise SerializationError(
            f"format={name!r} is not a registered format (registered: {sorted(formats)}){hint}"
        )
    return fmt


def _format_for_export(path: str, name: str | None) -> Format:
    if name is not None:
        return _format_named(name)
    formats = current_registry().formats
    suffix = Path(path).suffix.lower() if path else ""
    for fmt in formats.values():
        if suffix and suffix in fmt.suffixes:
            return fmt
    return formats["directory"]


def _detect(path: Any) -> Format:
    where = repr(str(path))
    if isinstance(path, str):  # a URL: only formats that accept remote paths may claim it
        for fmt in current_registry().formats.values():
            if fmt.remote_paths and fmt.sniff(path):
                return fmt
        raise SerializationError(
            f"{where}: no registered format that accepts remote paths recognises this as a "
            "checkpoint (the built-in formats read local paths only; jaxstruct-orbax reads "
            "the URLs orbax accepts)"
        )
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"{where}: no such checkpoint") from None
    is_dir = stat.S_ISDIR(mode)
    if not is_dir and not stat.S_ISREG(mode):
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


def open_checkpoint(
    path: Any, limits: Limits, format: str | None = None
) -> tuple[Format, OpenedCheckpoint, dict[str, Any]]:
    """Detect the format of ``path``, open it and parse its manifest (arrays are not read)."""
    fmt, opened, top = _open_any(path, limits, format)
    if top is None:
        opened.close()
        raise SerializationError(
            f"{str(path)!r}: this {fmt.name} file has no jaxstruct manifest (another tool "
            "wrote it); load it with jaxstruct.io.load(path, target=...)"
        )
    return fmt, opened, top


def _open_any(
    path: Any, limits: Limits, format: str | None
) -> tuple[Format, OpenedCheckpoint, dict[str, Any] | None]:
    """Open ``path``; the manifest is ``None`` for a file without one (see ``_plain``)."""
    fmt = _detect(path) if format is None else _format_named(format)
    where = repr(str(path))
    opened = fmt.open(path, limits)
    if opened.manifest is None:
        return fmt, opened, None
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


def _local_or_url(path: str | os.PathLike[str], fmt: Format | None, what: str) -> Any:
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"{what}() expected a str or os.PathLike path, got {path!r}")
    if is_url(text):
        if fmt is not None and not fmt.remote_paths:
            raise SerializationError(
                f"{text!r} is a URL, and the {fmt.name!r} format writes local paths only (nothing "
                'was written); use format="orbax" (pip install jaxstruct-orbax) for remote '
                "storage, or give a local path"
            )
        return text
    return Path(text).absolute()


def _check_existing(target: Any, fmt: Format, overwrite: bool) -> bool:
    """Refuse an existing target that may not be replaced; return whether one exists (ours)."""
    if isinstance(target, str):
        if overwrite:
            raise SerializationError(
                f"{target!r}: overwrite=True is not supported for remote paths (it cannot be "
                "replaced atomically); export to a new path"
            )
        return False
    if os.path.lexists(target):
        if not overwrite:
            raise FileExistsError(
                f"{str(target)!r} already exists; pass overwrite=True to replace it, or choose "
                "another path"
            )
        if not _is_ours(fmt)(target):
            raise SerializationError(
                f"{str(target)!r} exists and is not a jaxstruct {fmt.name} checkpoint; "
                "overwrite=True only replaces checkpoints. Remove it yourself, or choose "
                "another path"
            )
        return True
    return False


def _disk_error(target: Any, err: OSError) -> CheckpointWriteError:
    return CheckpointWriteError(
        err.errno,
        f"{str(target)!r}: writing the checkpoint failed ({err.strerror or err}); "
        "nothing was replaced and any previous checkpoint there is intact. Free disk "
        "space or fix the permissions, then export again",
    )


def _publish(
    target: Path,
    fmt: Format,
    overwrite: bool,
    write: Callable[[Path], None],
    checked: bool = False,
    *,
    rewrite: Callable[[Path], bool] | None = None,
) -> None:
    """Create the checkpoint at a temporary sibling with ``write`` and move it into place.

    ``checked``: the caller has just found an existing checkpoint of ``fmt`` there.
    ``rewrite``: writes it into the target's spare instead, if it can (``_spare``).
    """
    _atomic.publish(
        target,
        write,
        overwrite=overwrite,
        is_ours=_is_ours(fmt),
        what=f"{fmt.name} checkpoint",
        checked=checked,
        rewrite=rewrite,
    )


def _replaces(target: Any, overwrite: bool) -> bool:
    return overwrite and isinstance(target, Path) and os.path.lexists(target)


def _replace_atomically(
    target: Path, fmt: Format, manifest: bytes, arrays: Mapping[str, Any], compression: str
) -> None:
    """Overwrite with a self-publishing format: write beside the target, then swap them."""
    if _multihost.process_count() > 1:
        _replace_everywhere(target, fmt, manifest, arrays, compression)
        return
    tmp = _atomic.temp_sibling(target)
    old: Path | None = None
    try:
        try:
            fmt.write(tmp, manifest, arrays, compression=compression, step=_atomic.step)
        except OSError as err:
            raise _disk_error(target, err) from err
        old = _atomic.exchange(tmp, target)
        _atomic.fsync_dir(target.parent)
        _atomic.step("published")
    finally:
        _atomic.remove(old if old is not None else tmp)
    _atomic.step("done")


def _replace_everywhere(
    target: Path, fmt: Format, manifest: bytes, arrays: Mapping[str, Any], compression: str
) -> None:
    """Overwrite in a multi-process run: every process writes the same temporary
    sibling (a format that writes collectively), then process 0 swaps it in."""
    primary = _multihost.is_primary()
    name = _atomic.temp_sibling(target).name if primary else ""
    tmp = target.with_name(_multihost.agree("overwrite-name", name))
    try:
        fmt.write(tmp, manifest, arrays, compression=compression, step=_atomic.step)
    except BaseException as err:
        if primary:
            _atomic.remove(tmp)
        if isinstance(err, OSError):
            raise _disk_error(target, err) from err
        raise
    error: BaseException | None = None
    if primary:
        old: Path | None = None
        try:
            old = _atomic.exchange(tmp, target)
            _atomic.fsync_dir(target.parent)
            _atomic.step("published")
        except BaseException as err:
            error = _disk_error(target, err) if isinstance(err, OSError) else err
        finally:
            _atomic.remove(old if old is not None else tmp)
    _multihost.share_outcome("overwrite-publish", error)
    if error is not None:
        raise error
    _atomic.step("done")


def _is_ours(fmt: Format) -> Callable[[Path], bool]:
    """Whether an existing path may be replaced: the format's cheap ``owns`` check if it has
    one (the built-ins read a few bytes), else a full open of the checkpoint."""
    owns = getattr(fmt, "owns", None)
    return owns if owns is not None else (lambda existing: is_checkpoint(existing, fmt))


def _write_everywhere(
    target: Any,
    fmt: Format,
    manifest: bytes,
    arrays: Mapping[str, Any],
    *,
    overwrite: bool,
    compression: str,
    background: bool,
    checked: bool = False,
) -> PendingWrite | None:
    """Write and publish the checkpoint (in this thread); return a format's own pending write.

    ``checked``: an existing checkpoint of ``fmt`` was found at ``target`` just before.
    """
    step = _atomic.step
    if fmt.multiprocess or _multihost.process_count() == 1:
        if fmt.publishes_atomically and _replaces(target, overwrite):
            _replace_atomically(target, fmt, manifest, arrays, compression)
            return None
        if fmt.publishes_atomically:
            if background:
                pending = fmt.write_async(
                    target, manifest, arrays, compression=compression, step=step
                )
                if pending is not None:
                    return pending
            try:
                fmt.write(target, manifest, arrays, compression=compression, step=step)
            except OSError as err:
                raise _disk_error(target, err) from err
            _atomic.step("published")
            _atomic.step("done")
            return None
        rewrite = getattr(fmt, "rewrite", None) if type(fmt) is DirectoryFormat else None
        _publish(
            target,
            fmt,
            overwrite,
            lambda tmp: fmt.write(tmp, manifest, arrays, compression=compression, step=step),
            checked,
            rewrite=None
            if rewrite is None
            else lambda spare: rewrite(spare, manifest, arrays, compression=compression, step=step),
        )
        return None
    # A single-writer format in a multi-process run: process 0 checks the path and
    # writes; the others wait for its word and fail as it failed (they never look at
    # the path themselves: process 0 may already have published there).
    error: BaseException | None = None
    if _multihost.is_primary():
        try:
            found = _check_existing(target, fmt, overwrite)
            _publish(
                target,
                fmt,
                overwrite,
                lambda tmp: fmt.write(tmp, manifest, arrays, compression=compression, step=step),
                found,
            )
        except BaseException as err:
            error = err
    _multihost.share_outcome(f"export-{fmt.name}", error)
    if error is not None:
        raise error
    return None


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
    path ending in ``.zip`` gives one zip archive and any other path a
    directory holding ``manifest.json`` and ``arrays.npz``. The checkpoint is
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
        compression: ``"auto"`` deflates array members that shrink and stores
            the others; ``"deflate"`` always deflates; ``"none"`` never does.
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
            ``format`` is unknown, the path is a URL the format cannot write, or
            ``overwrite=True`` would replace something that is not a jaxstruct
            checkpoint.
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
    if not isinstance(blocking, bool):
        raise TypeError(f"blocking expected a bool, got {blocking!r}")
    text = os.fspath(path)
    fmt = _format_for_export(text if isinstance(text, str) else "", format)
    target = _local_or_url(path, fmt, "export")
    key = str(target)
    # A new export to a path waits for the previous non-blocking one to finish.
    _async.wait_for_previous(key)
    _atomic.step("start")
    single_writer = not fmt.multiprocess and _multihost.process_count() > 1
    found = False
    if not single_writer:  # otherwise process 0 alone checks, when it writes
        found = _check_existing(target, fmt, overwrite)
    # Encode everything before touching the disk: an unrepresentable value
    # fails here and nothing is written.
    state = encode_state(obj)
    manifest = dump_manifest(state, fmt.name)
    arrays: dict[str, Any] = state["array_data"]
    if single_writer:
        _multihost.check_primary_holds(arrays, fmt.name, repr(key))
    _atomic.step("encoded")
    if blocking:
        _write_everywhere(
            target,
            fmt,
            manifest,
            arrays,
            overwrite=overwrite,
            compression=compression,
            background=False,
            checked=found,
        )
        return target
    handle = _async.ExportHandle(target, key)
    if (
        type(fmt).write_async is Format.write_async
        or not fmt.publishes_atomically
        or _replaces(target, overwrite)
    ):
        # The format writes synchronously: copy what the caller may change or donate
        # now, and write from those private copies in a background thread.
        arrays = {k: _async.host_copy(v) for k, v in arrays.items()}
        work = functools.partial(
            _write_everywhere,
            target,
            fmt,
            manifest,
            arrays,
            overwrite=overwrite,
            compression=compression,
            background=False,
        )
    else:
        # The format's own asynchronous write takes its own copies before returning.
        pending = _write_everywhere(
            target,
            fmt,
            manifest,
            arrays,
            overwrite=overwrite,
            compression=compression,
            background=True,
        )
        work = lambda: pending
    _async.register(handle)
    handle._start(work)
    return handle


def load(
    path: str | os.PathLike[str],
    *,
    target: Any = None,
    select: Callable[[Any], Any] | None = None,
    load_cls: Any = None,
    allow_imports: Iterable[str] = (),
    rename: Rename | None = None,
    format: str | None = None,
    **limits: int,
) -> Any:
    """Read a checkpoint written by :func:`export`, or a file of a format without a manifest.

    Loading never imports a module (except those listed in
    ``allow_imports``) and never unpickles; every limit is checked before the
    memory it guards is allocated.

    Args:
        path: a checkpoint directory or file (or a URL, for formats that
            accept remote paths).
        target: where to put the arrays: a tree of the stored structure whose
            array leaves are ``jax.Array`` (restored with its sharding),
            ``jax.ShapeDtypeStruct`` (its sharding, or as stored without one) or
            ``None`` (as stored); ``jax.eval_shape`` of the value builds one.
            Shapes and dtypes must match what is stored. The target also
            vouches, at its own places only, for the classes it holds (a
            struct, namedtuple, enum or other pytree node class named there
            by the file is taken from it, with no ``allow_imports``), for the
            values of the fields a struct does not store (``serialize=False``
            and opaque fields; the default where the target's value is
            abstract), and for the functions inside other libraries' pytree
            nodes, which checkpoints never store.
        select: partial restore: a function picking part of the stored value
            (``lambda s: s.params``, or one returning a
            :class:`jaxstruct.core.Selection`); only the arrays inside that
            part are read, and ``load`` returns ``select(value)``. (When a
            converter, validator or migration of the stored classes needs real
            array values to rebuild the structure, every array is read.)
        load_cls: the expected class of the root value (also used to resolve
            the root's class reference), or a mapping ``{"module:Qual": cls}``.
        allow_imports: module names (or package prefixes) that may be
            imported to find classes.
        rename: only for a file another tool wrote, without a jaxstruct
            manifest (a plain ``.safetensors`` file, a plain orbax
            checkpoint), which fills ``target`` by tree path: a mapping from
            stored tensor names to the target's leaf names
            (``params.layers.0.w``), or a function returning the leaf name, or
            ``None`` to ignore a tensor. Refused for a jaxstruct checkpoint,
            whose manifest names every array.
        format: read ``path`` as this registered format instead of detecting it.
        **limits: ``max_manifest_bytes=``, ``max_depth=``, ``max_nodes=``,
            ``max_array_bytes=``, ``max_inflation_ratio=`` raise those limits.

    Returns:
        The stored value (or ``select`` of it).

    Raises:
        FileNotFoundError: nothing exists at ``path``.
        SerializationError: the checkpoint is malformed, exceeds a limit, names
            a class this process may not use, or does not match ``target``; the
            message says which (and where in the tree).

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "ckpt"
        >>> _ = export({"step": 3}, target)
        >>> load(target)
        {'step': 3}
    """
    lim = limits_from_kwargs("load", limits)
    resolver = Resolver(load_cls, allow_imports)
    # Parsing the manifest and rebuilding the value make a few objects per node,
    # none cyclic: the collector's passes over 100,000 of them cost more than that.
    with _gc.paused():
        value = _load(
            path, lim, resolver, target=target, select=select, rename=rename, format=format
        )
    return value


def _load(
    path: str | os.PathLike[str],
    lim: Limits,
    resolver: Resolver,
    *,
    target: Any,
    select: Callable[[Any], Any] | None,
    rename: Rename | None = None,
    format: str | None = None,
) -> Any:
    where_path = _local_or_url(path, None, "load")
    if isinstance(where_path, Path):
        where_path = Path(os.fspath(path))
    where = repr(str(where_path))
    _, opened, top = _open_any(where_path, lim, format)
    if top is None:
        try:
            return load_plain(opened, target=target, rename=rename, select=select, where=where)
        finally:
            opened.close()
    try:
        if rename is not None:
            raise SerializationError(
                f"{where}: rename= is only for files without a jaxstruct manifest; this "
                "checkpoint's manifest names every array, so leave rename= out"
            )
        manifest = top["manifest"]
        if not isinstance(manifest, dict) or set(manifest) != {"root", "nodes"}:
            raise SerializationError(
                f"{where}: 'manifest' must be an object with 'root' and 'nodes'"
            )
        table = {k: ArraySpec(*v) for k, v in check_arrays_table(top["arrays"], where, lim).items()}
        nodes = manifest["nodes"]
        if not isinstance(nodes, list):
            raise SerializationError(f"{where}: the manifest has no 'nodes' list")
        match = match_target(nodes, manifest["root"], table, target, where)
        wanted = match.placements
        stand_ins: dict[str, Any] = {}
        if select is not None:
            stand_ins = _abstract_arrays(table, wanted)
            try:
                skeleton = decode_state(
                    manifest,
                    table,
                    stand_ins,
                    resolver=resolver,
                    limits=lim,
                    source=where,
                    target=match,
                )
            except SerializationError:
                # A converter, validator or migration of the stored classes needs real
                # array values to rebuild the structure: read everything instead.
                stand_ins = {}
            else:
                picked = _selected_keys(select, skeleton, stand_ins, where)
                wanted = {k: wanted[k] for k in wanted if k in picked}
                stand_ins = {k: v for k, v in stand_ins.items() if k not in wanted}
        arrays = opened.read_arrays(table, wanted)
    finally:
        opened.close()
    if stand_ins:
        arrays = {**stand_ins, **arrays}
    value = decode_state(
        manifest, table, arrays, resolver=resolver, limits=lim, source=where, target=match
    )
    return value if select is None else select(value)


def _abstract_arrays(table: Mapping[str, ArraySpec], wanted: Mapping[str, Any]) -> dict[str, Any]:
    import jax

    return {
        k: jax.ShapeDtypeStruct(spec.shape, spec.dtype, sharding=wanted.get(k))
        for k, spec in table.items()
    }


def _selected_keys(
    select: Callable[[Any], Any], skeleton: Any, stand_ins: Mapping[str, Any], where: str
) -> set[str]:
    """Return the array keys inside the part of ``skeleton`` that ``select`` picks."""
    import jax

    try:
        picked = select(skeleton)
    except Exception as err:
        raise SerializationError(
            f"{where}: select={getattr(select, '__qualname__', select)!r} failed on the stored "
            f"structure ({type(err).__name__}: {err}); it may navigate with attributes and "
            "indexing (arrays are abstract jax.ShapeDtypeStruct values at that point)"
        ) from err
    get_sequence = getattr(picked, "get_sequence", None)
    if callable(get_sequence) and hasattr(picked, "remainder"):
        picked = get_sequence()  # a jaxstruct.core.Selection: its selected subtrees
    by_id = {id(v): k for k, v in stand_ins.items()}
    leaves = jax.tree_util.tree_leaves(picked, is_leaf=lambda x: id(x) in by_id)
    return {by_id[id(leaf)] for leaf in leaves if id(leaf) in by_id}
