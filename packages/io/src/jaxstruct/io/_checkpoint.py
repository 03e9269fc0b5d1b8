"""Checkpoints on disk: :func:`export` and :func:`load`."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, overload

from jaxstruct.registry import SerializationError

from . import _async, _fs, _multihost
from ._async import ExportHandle
from ._decode import Resolver, decode_state, outside_selection, undecoded_codec
from ._detect import format_for_export, open_any, read_checked
from ._encode import encode_state
from ._formats import ArraySpec, OpenedCheckpoint, PendingWrite
from ._plain import Rename, load_plain
from ._publish import Publication, local_or_url, local_paths_only
from ._schema import check_arrays_table, dump_manifest, limits_from_kwargs
from ._targets import match_target, mesh_placements

_COMPRESSIONS = ("auto", "deflate", "none")


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
            checkpoint, or a plugin format broke its contract (its ``write``
            raised, created nothing or the wrong kind of thing; the previous
            checkpoint is left in place).
        CheckpointWriteError: the disk failed while writing (full, read-only,
            ...); the previous checkpoint is left in place. It is an ``OSError``
            with the original ``errno``, and a :class:`SerializationError`.
        PluginError: the format, suffix or a value's codec belongs to a plugin
            that failed to load, or to two plugins.

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
    fmt = format_for_export(text if isinstance(text, str) else "", format)
    target = local_or_url(path, "export")
    if isinstance(target, Path):
        target = target.absolute()
    elif not fmt.remote_paths:
        raise local_paths_only(repr(target), fmt)
    key = str(target)
    # A new export to a path waits for the previous non-blocking one to finish.
    _async.wait_for_previous(key)
    _fs.step("start")
    publication = Publication(target, fmt, overwrite)  # refuses what may not be replaced
    # Encode everything before touching the disk: an unrepresentable value
    # fails here and nothing is written.
    state = encode_state(obj)
    manifest = dump_manifest(state, fmt.name)
    arrays: dict[str, Any] = state["array_data"]
    publication.refuse_unheld(arrays)
    _fs.step("encoded")
    if blocking:
        publication.run(manifest, arrays, compression)
        return target
    handle = _async.ExportHandle(target, key)
    pending = publication.start(manifest, arrays, compression)
    if pending is not None:  # the format's own background write took its own copies
        work: Callable[[], PendingWrite | None] = lambda: pending
    else:
        # Copy what the caller may change or donate now, and write from those
        # private copies in a background thread.
        copies = {k: _async.host_copy(v) for k, v in arrays.items()}
        work = functools.partial(publication.run, manifest, copies, compression)
    _async.register(handle)
    handle._start(work)
    return handle


def load(
    path: str | os.PathLike[str],
    *,
    target: Any = None,
    select: Callable[[Any], Any] | None = None,
    load_cls: Any = None,
    allow_imports: Iterable[str] | None = (),
    mesh: Any = None,
    strict_mesh: bool = False,
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
            imported to find classes; a function name stored in another
            library's node (an NNX module's ``dot_general``) is resolved only
            to a plain function of one of these modules, never called.
        mesh: restore without a template: a ``jax.sharding.Mesh`` on which
            each array gets back the ``PartitionSpec`` it was saved with (mesh
            axes matched by name; arrays saved unsharded are replicated).
            Each process reads only its own shards. Arrays ``target`` places
            itself keep its placement. Needs a format that records shardings
            (``"orbax"``).
        strict_mesh: with ``mesh``, refuse an array saved sharded along an
            axis ``mesh`` lacks, instead of replicating it along that axis.
        rename: only for a file another tool wrote, without a jaxstruct
            manifest (a plain ``.safetensors`` file, a plain orbax
            checkpoint), which fills ``target`` by tree path: a mapping from
            stored tensor names to the target's leaf names
            (``params.layers.0.w``), or a function returning the leaf name, or
            ``None`` to ignore a tensor. Refused for a jaxstruct checkpoint,
            whose manifest names every array. Without ``target``, a file that
            holds nothing but named tensors (a ``.safetensors`` file) loads as
            a dict ``{tensor name: NumPy array}``, its keys renamed by
            ``rename``; another (a plain orbax checkpoint) needs ``target``.
        format: read ``path`` as this registered format instead of detecting it.
        **limits: ``max_manifest_bytes=``, ``max_depth=``, ``max_nodes=``,
            ``max_array_bytes=``, ``max_inflation_ratio=`` raise those limits.

    Returns:
        The stored value (or ``select`` of it).

    Raises:
        FileNotFoundError: nothing exists at ``path``.
        SerializationError: the checkpoint is malformed, exceeds a limit, names
            a class this process may not use, or does not match ``target``; the
            message says which (and where in the tree). With ``mesh``: the
            checkpoint does not record its shardings, or (``strict_mesh``) an
            array was sharded along an axis the mesh lacks.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "ckpt"
        >>> _ = export({"step": 3}, target)
        >>> load(target)
        {'step': 3}
    """
    lim = limits_from_kwargs("load", limits)
    resolver = Resolver(load_cls, allow_imports)
    if not isinstance(strict_mesh, bool):
        raise TypeError(f"strict_mesh expected a bool, got {strict_mesh!r}")
    where_path = local_or_url(path, "load")
    where = repr(str(where_path))
    fmt, opened, top = open_any(where_path, lim, format)
    if top is None:
        try:
            if target is None and mesh is not None:
                raise SerializationError(
                    f"{where}: mesh= puts arrays back as they were saved sharded, and this "
                    f"{fmt.name} checkpoint (another tool wrote it) records no shardings; pass "
                    "target= with the shardings you want (jax.ShapeDtypeStruct(shape, dtype, "
                    "sharding=...) leaves)"
                )
            return load_plain(fmt, opened, target=target, rename=rename, select=select, where=where)
        finally:
            opened.close()
    try:
        if rename is not None:
            raise SerializationError(
                f"{where}: rename= is only for files without a jaxstruct manifest; this "
                "checkpoint's manifest names every array, so leave rename= out"
            )
        if fmt.multiprocess and _multihost.process_count() > 1:
            # Every process reads collectively: one that never comes is named here.
            _multihost.barrier("load-start", path=where)
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
        if mesh is not None:
            wanted = _on_mesh(opened, wanted, mesh, strict_mesh, where)
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
                    codec_named=undecoded_codec,
                )
            except SerializationError:
                # A converter, validator or migration of the stored classes needs real
                # array values to rebuild the structure: read everything instead.
                stand_ins = {}
            else:
                picked = _selected_keys(select, skeleton, stand_ins, where)
                wanted = {k: wanted[k] for k in wanted if k in picked}
                stand_ins = {k: v for k, v in stand_ins.items() if k not in wanted}
        arrays = read_checked(fmt, opened, table, wanted, where)
    finally:
        opened.close()
    if stand_ins:
        arrays = {**stand_ins, **arrays}
    value = decode_state(
        manifest,
        table,
        arrays,
        resolver=resolver,
        limits=lim,
        source=where,
        target=match,
        codec_named=outside_selection(list(stand_ins.values())) if stand_ins else None,
    )
    return value if select is None else select(value)


def _on_mesh(
    opened: OpenedCheckpoint,
    wanted: Mapping[str, Any],
    mesh: Any,
    strict: bool,
    where: str,
) -> dict[str, Any]:
    """``wanted`` with the arrays the target leaves unplaced put on ``mesh`` as saved."""
    unplaced = [k for k, p in wanted.items() if p is None]
    if not unplaced:
        return dict(wanted)
    placed = mesh_placements(opened.saved_shardings(), unplaced, mesh, strict=strict, where=where)
    return {k: placed.get(k, p) for k, p in wanted.items()}


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
