"""Checkpoints on disk, read: :func:`load`, step by step, and which format a path holds.

``load`` reads as the steps of the docs' "What happens on load" (docs/contributing.md):
find the path's format and open it (detection, below: it only answers "which format
is this", by one rule for every format, and opens it), read its manifest, plan the
reads (the target, ``mesh=`` and ``select=``), read the arrays (a plugin's are checked
by ``_contract``), decode the value.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from jaxstruct.registry import SerializationError, StructError

from . import _multihost
from ._contract import expected_checks, format_failed, read_checked, source_of
from ._decode import Resolver, decode_state, outside_selection, undecoded_codec
from ._export import FILE_SUFFIXES, suffix_hint, unknown_format
from ._formats import ArraySpec, Format, OpenedCheckpoint, identity, local_or_url, stat_identity
from ._plain import Rename, load_plain
from ._plugins import BLOCK_ENV, PluginError, current_registry
from ._publish import parked
from ._schema import Limits, check_arrays_table, limits_from_kwargs, parse_manifest
from ._targets import match_target, mesh_placements


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
        >>> from jaxstruct.io import export
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
    if top is None:  # a file another tool wrote: its tensors fill the target by tree path
        return _load_without_manifest(
            fmt, opened, where, target=target, mesh=mesh, rename=rename, select=select
        )
    try:
        if rename is not None:
            raise SerializationError(
                f"{where}: rename= is only for files without a jaxstruct manifest; this "
                "checkpoint's manifest names every array, so leave rename= out"
            )
        manifest, table = read_manifest(fmt, top, where, lim)
        plan = plan_reads(
            opened,
            manifest,
            table,
            where,
            target=target,
            mesh=mesh,
            strict_mesh=strict_mesh,
            select=select,
            resolver=resolver,
            limits=lim,
        )
        arrays = read_arrays(fmt, opened, top, table, plan.wanted, where=where)
    finally:
        opened.close()
    value = decode_value(manifest, table, arrays, plan, resolver=resolver, limits=lim, where=where)
    return value if select is None else select(value)


def _load_without_manifest(
    fmt: Format,
    opened: OpenedCheckpoint,
    where: str,
    *,
    target: Any,
    mesh: Any,
    rename: Rename | None,
    select: Callable[[Any], Any] | None,
) -> Any:
    """Load a file another tool wrote (no jaxstruct manifest) into ``target`` by tree path."""
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


# -- 2. read the manifest ------------------------------------------------------------------


def read_manifest(
    fmt: Format, top: dict[str, Any], where: str, limits: Limits
) -> tuple[dict[str, Any], dict[str, ArraySpec]]:
    """The checked manifest (``root`` and ``nodes``) and arrays table of an opened checkpoint;
    in a multi-process run of a multi-process format, every process arrives here first."""
    if fmt.multiprocess and _multihost.process_count() > 1:
        # Every process reads collectively: one that never comes is named here.
        _multihost.barrier("load-start", path=where)
    manifest = top["manifest"]
    if not isinstance(manifest, dict) or set(manifest) != {"root", "nodes"}:
        raise SerializationError(f"{where}: 'manifest' must be an object with 'root' and 'nodes'")
    if not isinstance(manifest["nodes"], list):
        raise SerializationError(f"{where}: the manifest has no 'nodes' list")
    table = {k: ArraySpec(*v) for k, v in check_arrays_table(top["arrays"], where, limits).items()}
    return manifest, table


# -- 3. plan the reads: the target, mesh= and select= ----------------------------------------


class ReadPlan(NamedTuple):
    """What :func:`load` reads, and what decoding is told.

    Attributes:
        wanted: the array keys to read, each with its placement (``None``: host).
        stand_ins: abstract arrays standing for those a partial restore leaves unread.
        match: what the target says about the stored tree (``None``: no target).
    """

    wanted: dict[str, Any]
    stand_ins: dict[str, Any]
    match: Any


def plan_reads(
    opened: OpenedCheckpoint,
    manifest: dict[str, Any],
    table: dict[str, ArraySpec],
    where: str,
    *,
    target: Any,
    mesh: Any,
    strict_mesh: bool,
    select: Callable[[Any], Any] | None,
    resolver: Resolver,
    limits: Limits,
) -> ReadPlan:
    """Which arrays to read and where to place them: every array on the host, unless a
    ``target`` places them (and vouches for classes), ``mesh=`` puts them back as saved,
    or ``select=`` picks part of the value (then only the arrays inside it are read)."""
    if target is None and mesh is None and select is None:
        return ReadPlan(dict.fromkeys(table), {}, None)
    match = match_target(manifest["nodes"], manifest["root"], table, target, where)
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
                limits=limits,
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
    return ReadPlan(wanted, stand_ins, match)


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


# -- 4-5. read the arrays (and check a plugin's) ---------------------------------------------


def read_arrays(
    fmt: Format,
    opened: OpenedCheckpoint,
    top: dict[str, Any],
    table: dict[str, ArraySpec],
    wanted: Any,
    *,
    where: str,
) -> dict[str, Any]:
    """Read the ``wanted`` arrays; a format not jaxstruct-io's own is checked (``_contract``:
    every wanted array, with the stored shape and dtype, and against the CRC-32s the
    manifest records for a format that keeps none of its own)."""
    if current_registry().is_own(fmt):
        return opened.read_arrays(table, wanted)
    checks = expected_checks(fmt, opened, top, table, where)
    return read_checked(fmt, opened, table, wanted, where, checks=checks)


# -- 6. decode ----------------------------------------------------------------------------


def decode_value(
    manifest: dict[str, Any],
    table: dict[str, ArraySpec],
    arrays: dict[str, Any],
    plan: ReadPlan,
    *,
    resolver: Resolver,
    limits: Limits,
    where: str,
) -> Any:
    """The stored value, rebuilt from the manifest and the arrays read (a partial restore's
    unread arrays stay abstract stand-ins, and codec values holding them undecoded)."""
    stand_ins = plan.stand_ins
    return decode_state(
        manifest,
        table,
        {**stand_ins, **arrays} if stand_ins else arrays,
        resolver=resolver,
        limits=limits,
        source=where,
        target=plan.match,
        codec_named=outside_selection(list(stand_ins.values())) if stand_ins else None,
    )


# -- 1. which format a path holds (detection), and opening it ----------------------------------


def format_named(name: str) -> Format:
    """The registered format ``name``, or our error (``format=`` of load, the manager)."""
    if not isinstance(name, str):
        raise TypeError(f"format expected a str (a registered format name), got {name!r}")
    registry = current_registry()
    fmt = registry.format_named(name)
    if fmt is None:
        raise unknown_format(name, registry)
    return fmt


def sniffs(fmt: Format, path: Any, errors: list[str] | None = None) -> bool:
    """Whether ``fmt`` recognises ``path``; a plugin's sniff that raises recognises nothing
    (its error is noted in ``errors`` for the message if no format recognises the path)."""
    try:
        return bool(fmt.sniff(path))
    except OSError:
        return False
    except Exception as err:
        message = (
            f"the sniff() of format {fmt.name!r} ({source_of(fmt)}) raised "
            f"{type(err).__name__}: {err}"
        )
        if errors is None:
            raise PluginError(message) from err
        errors.append(message)
        return False


def _open_checked(
    fmt: Format, path: Any, limits: Limits
) -> tuple[OpenedCheckpoint, dict[str, Any] | None]:
    """Open ``path`` as ``fmt`` and parse its manifest (``None`` for a file without one)."""
    where = repr(str(path))
    try:
        opened = fmt.open(path, limits)
    except (OSError, StructError):
        raise
    except Exception as err:
        raise format_failed(fmt, "open", where, err) from err
    if opened.manifest is None:  # a file another tool wrote (see ``_plain``)
        return opened, None
    try:
        top = parse_manifest(opened.manifest, where)
        container = top["container"]
        if container != fmt.name and container not in fmt.also_reads:
            raise _ContainerMismatch(
                f"{where}: the manifest says container {container!r} but the file is a "
                f"{fmt.name!r} checkpoint",
                container,
            )
    except BaseException:
        opened.close()
        raise
    return opened, top


class _ContainerMismatch(SerializationError):
    def __init__(self, message: str, container: Any) -> None:
        super().__init__(message)
        self.container = container if isinstance(container, str) else ""


def open_checkpoint(path: Any, limits: Limits) -> tuple[Format, OpenedCheckpoint, dict[str, Any]]:
    """Detect the format of ``path``, open it and parse its manifest (arrays are not read)."""
    fmt, opened, top = open_any(path, limits)
    if top is None:
        opened.close()
        raise SerializationError(
            f"{str(path)!r}: this {fmt.name} file has no jaxstruct manifest (another tool "
            "wrote it); load it with jaxstruct.io.load(path, target=...)"
        )
    return fmt, opened, top


Opened = tuple[Format, OpenedCheckpoint, "dict[str, Any] | None"]


def open_any(path: Any, limits: Limits, format: str | None = None) -> Opened:
    """:func:`open_checkpoint`, but a file without a manifest gives ``None`` for it.

    While a two-rename overwrite runs, the checkpoint parked beside ``path`` is opened.
    """
    for _ in range(3):
        try:
            return _open_here(path, limits, format)
        except FileNotFoundError:
            if not isinstance(path, Path):
                raise
            found = parked(Path(os.path.abspath(path)))
            if not found and not os.path.lexists(path):
                raise
        for candidate in found:
            try:
                return _open_here(candidate, limits, format)
            except (FileNotFoundError, SerializationError):
                continue  # being deleted: the new checkpoint is in place by now
    return _open_here(path, limits, format)


def _open_here(path: Any, limits: Limits, format: str | None) -> Opened:
    """Open ``path`` itself, as ``format`` or as the format that recognises it.

    Without ``format``, every registered format (the built-in ones register like any
    plugin) is asked by the same rules: the format ``export`` would choose for this
    name (its suffix's, else ``"directory"``) first, when it recognises (``sniff``)
    and opens the path; then every format of the path's kind whose ``sniff``
    recognises it. One of those: it opens the path. Several: each opens it, and
    the one whose manifest names it wins.
    """
    if format is not None:
        fmt = format_named(format)
        if isinstance(path, Path) and fmt.is_directory != _kind(path)[1]:
            kind, wanted = ("directory", "files") if _kind(path)[1] else ("file", "directories")
            raise SerializationError(
                f"{str(path)!r}: is a {kind}, and the {fmt.name!r} format reads {wanted}; "
                "leave format= out to recognise the checkpoint's format, or pass its format"
            )
        return (fmt, *_open_checked(fmt, path, limits))
    preferred, first_error = _preferred(path), None
    if preferred is not None:
        try:
            return _open_one(preferred, path, limits)
        except SerializationError as err:
            first_error = err  # another format may recognise it (its manifest at the root)
    found = _candidates(path, preferred, first_error)
    if len(found) == 1 and first_error is None:
        return _open_one(found[0], path, limits)
    matches: list[Opened] = []
    for fmt in found:
        try:
            opened, top = _open_checked(fmt, path, limits)
        except Exception:
            continue
        if top is not None and top["container"] == fmt.name:
            matches.append((fmt, opened, top))
        else:
            opened.close()
    if len(matches) == 1:
        return matches[0]
    for _, opened, _ in matches:
        opened.close()
    if first_error is not None:
        raise first_error
    registry = current_registry()
    names = ", ".join(f"{f.name!r} ({registry.source_of('format', f.name)})" for f in found)
    raise PluginError(
        f"{str(path)!r}: several formats recognise this path and none claims its suffix: "
        f"{names}; one of them recognises files that are not its own: block its plugin with "
        f"{BLOCK_ENV}=<name>, or report it to its authors"
    )


def _open_one(fmt: Format, path: Any, limits: Limits) -> Opened:
    """Open ``path`` as ``fmt``; a manifest naming another format that recognises the
    path (a format built on another, a zip-based one without its suffix) gives that one."""
    try:
        return (fmt, *_open_checked(fmt, path, limits))
    except _ContainerMismatch as err:
        other = current_registry().format_named(err.container)
        if other is None or other is fmt or not sniffs(other, path):
            raise
        return (other, *_open_checked(other, path, limits))


def _kind(path: Any) -> tuple[os.stat_result, bool]:
    """``path``'s stat and whether it is a directory; anything else than a regular file or
    a directory is refused."""
    where = repr(str(path))
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"{where}: no such checkpoint") from None
    is_dir = stat.S_ISDIR(st.st_mode)
    if not is_dir and not stat.S_ISREG(st.st_mode):
        raise SerializationError(f"{where}: is not a regular file or directory")
    return st, is_dir


def _preferred(path: Any) -> Format | None:
    """The format ``export`` would choose for ``path``'s name, if it is of the path's kind
    and recognises it (a suffix of a plugin that failed gives none)."""
    if isinstance(path, str):
        return None  # a URL: only formats that accept remote paths are asked
    _, is_dir = _kind(path)
    registry = current_registry()
    suffix = path.suffix.lower()
    try:
        fmt = registry.format_for_suffix(suffix) if suffix else None
        if fmt is None and is_dir:
            fmt = registry.format_named("directory")
    except PluginError:
        return None
    if fmt is None or fmt.is_directory != is_dir or not sniffs(fmt, path, []):
        return None
    return fmt


def _candidates(path: Any, preferred: Format | None, failed: Exception | None) -> list[Format]:
    """The other formats whose ``sniff`` recognises ``path``; none: the reason, raised
    (``failed``, the preferred format's error, when it recognised the path)."""
    where = repr(str(path))
    registry = current_registry()
    if isinstance(path, str):  # a URL: only formats that accept remote paths may claim it
        found = [f for f in registry.formats.values() if f.remote_paths and sniffs(f, path)]
        if not found:
            raise SerializationError(
                f"{where}: no registered format that accepts remote paths recognises this as a "
                "checkpoint (the built-in formats read local paths only; jaxstruct-orbax reads "
                "the URLs orbax accepts)"
            )
        return found
    st, is_dir = _kind(path)
    errors: list[str] = []
    found = [
        f
        for f in registry.formats.values()
        if f is not preferred and f.is_directory == is_dir and sniffs(f, path, errors)
    ]
    if found:
        return found
    if failed is not None:
        raise failed
    suffix = path.suffix.lower()
    try:
        owner = registry.format_for_suffix(suffix) if suffix else None
    except PluginError:
        if not errors:
            raise
        owner = None
    if identity(path) != stat_identity(st):
        # Swapped away while the formats looked at it (an overwrite): the caller retries.
        raise FileNotFoundError(f"{where}: replaced while it was being opened")
    kind = "directory" if is_dir else "file"
    if not os.access(path, os.R_OK | (os.X_OK if is_dir else 0)):
        raise SerializationError(
            f"{where}: this {kind} cannot be read (permission denied); give this user read "
            "access to it, or load it as its owner"
        )
    if owner is not None:
        hint = (
            f"; its suffix {suffix!r} is the {owner.name!r} format's, which does not recognise it"
        )
    elif suffix in FILE_SUFFIXES:
        hint = f"; no registered format claims the suffix {suffix!r}{suffix_hint(registry)}"
    else:
        more = registry.missing_hint()
        hint = f"; {more}" if more else ""
    if errors:
        hint += "; " + "; ".join(errors[:3])
    raise SerializationError(
        f"{where}: this {kind} is not a checkpoint of any registered format "
        f"({sorted(registry.formats)}){hint}"
    )
