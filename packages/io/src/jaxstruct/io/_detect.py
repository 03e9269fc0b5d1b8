"""The format of a path: by suffix on export, recognised on load; the format contract checked."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from jaxstruct.registry import SerializationError, StructError

from . import _fs
from ._formats import ArraySpec, Format, OpenedCheckpoint
from ._plugins import BLOCK_ENV, PluginError, current_registry
from ._schema import Limits, check_arrays_table, parse_manifest

T = TypeVar("T")


def format_named(name: str) -> Format:
    if not isinstance(name, str):
        raise TypeError(f"format expected a str (a registered format name), got {name!r}")
    registry = current_registry()
    fmt = registry.format_named(name)
    if fmt is None:
        hint = (
            "; install jaxstruct-orbax (pip install jaxstruct-orbax) to get it"
            if name == "orbax"
            else ""
        )
        more = registry.missing_hint()
        raise SerializationError(
            f"format={name!r} is not a registered format (registered: "
            f"{sorted(registry.formats)}){hint}{'; ' + more if more else ''}"
        )
    return fmt


#: Suffixes of well-known single-file formats: a path ending in one that no
#: registered format claims is refused instead of becoming a directory.
FILE_SUFFIXES = frozenset(
    {
        ".bin", ".ckpt", ".gz", ".h5", ".hdf5", ".json", ".msgpack", ".nc", ".npy", ".npz",
        ".onnx", ".pickle", ".pkl", ".pt", ".pth", ".safetensors", ".tar", ".tgz", ".xz",
        ".zst",
    }
)  # fmt: skip


def format_for_export(path: str, name: str | None) -> Format:
    if name is not None:
        return format_named(name)
    registry = current_registry()
    suffix = Path(path).suffix.lower()
    if suffix:
        fmt = registry.format_for_suffix(suffix)
        if fmt is not None:
            return fmt
        if suffix in FILE_SUFFIXES:
            raise SerializationError(
                f"{path!r}: no registered format claims the suffix {suffix!r} (nothing was "
                f"written){_suffix_hint(registry)}; install the plugin that provides it, pass "
                'format= a registered format, or pass format="directory" to write a '
                "directory checkpoint under this name"
            )
        registry.check_suffix(path, suffix)  # an installed plugin not loaded may claim it
    return format_named("directory")


def _suffix_hint(registry: Any) -> str:
    claimed = sorted(registry.suffixes)
    more = registry.missing_hint()
    return f" (claimed: {', '.join(claimed)}){'; ' + more if more else ''}"


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
    opened = call_format(fmt, "open", where, lambda: fmt.open(path, limits))
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
            found = _fs.parked(Path(os.path.abspath(path)))
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
    if _fs.identity(path) != _fs.stat_identity(st):
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
        hint = f"; no registered format claims the suffix {suffix!r}{_suffix_hint(registry)}"
    else:
        more = registry.missing_hint()
        hint = f"; {more}" if more else ""
    if errors:
        hint += "; " + "; ".join(errors[:3])
    raise SerializationError(
        f"{where}: this {kind} is not a checkpoint of any registered format "
        f"({sorted(registry.formats)}){hint}"
    )


def owns_checkpoint(fmt: Format, path: Path) -> bool:
    """Whether ``path`` is a checkpoint of ``fmt``, which ``overwrite`` may replace (a
    format's ``owns`` that fails says no: nothing is replaced)."""
    try:
        return bool(fmt.owns(path))
    except Exception:
        return False


def call_format(fmt: Format, method: str, where: str, call: Callable[[], T], kept: str = "") -> T:
    """Run ``call`` (``fmt``'s ``method``); an exception of the format's own (not an
    ``OSError`` or one of ours) becomes a ``SerializationError`` naming the format and
    its distribution, chained. ``kept`` ends the message (what was left in place)."""
    try:
        return call()
    except (OSError, StructError):
        raise
    except Exception as err:
        raise SerializationError(
            f"{where}: the {fmt.name!r} format ({source_of(fmt)}) failed in {method}() "
            f"({type(err).__name__}: {err}){kept}"
        ) from err


def source_of(fmt: Format) -> str:
    """The distribution (or description) that registered ``fmt``, for messages."""
    try:
        return current_registry().describe_source("format", fmt.name)
    except (KeyError, PluginError):
        return type(fmt).__module__


def write_checked(
    fmt: Format,
    target: Any,
    manifest: bytes,
    arrays: Mapping[str, Any],
    compression: str,
    *,
    publishing: bool,
    check: bool = True,
    replacing: bool = False,
) -> None:
    """Call ``fmt.write`` and (with ``check``) check what it made against the format contract;
    ``replacing`` a previous checkpoint, check also that it holds what it was given."""
    call_format(
        fmt,
        "write",
        repr(str(target)),
        lambda: fmt.write(target, manifest, arrays, compression=compression, step=_fs.step),
        "; nothing was replaced",
    )
    if check and not current_registry().is_own(fmt) and isinstance(target, Path):
        check_written(fmt, target, publishing=publishing)
        if publishing and not fmt.publishes_atomically:
            # Made durable before export renames it into place, whatever the format did.
            _fs.fsync_tree(target)
        if replacing:
            check_contents(fmt, target, manifest)


def read_checked(
    fmt: Format,
    opened: OpenedCheckpoint,
    table: Mapping[str, Any],
    wanted: Mapping[str, Any],
    where: str,
) -> dict[str, Any]:
    """Call ``opened.read_arrays`` and check that it gave every wanted array with the
    stored shape and dtype: a format's bug never reaches the user as wrong data or a
    foreign exception. (jaxstruct-io's own formats check each member's header against
    the table as they read it.)"""
    arrays = call_format(fmt, "read_arrays", where, lambda: opened.read_arrays(table, wanted))
    if current_registry().is_own(fmt):
        return arrays
    if not isinstance(arrays, Mapping):
        raise SerializationError(
            f"{where}: the {fmt.name!r} format ({source_of(fmt)}) returned "
            f"{type(arrays).__name__} from read_arrays(); a format must return a dict of "
            "the wanted keys"
        )
    for key in wanted:
        arr = arrays.get(key)
        dtype, shape = table[key][0], tuple(table[key][1])
        got = (getattr(arr, "dtype", None), tuple(getattr(arr, "shape", ())))
        if got[0] != dtype and wanted[key] is not None:  # placed: as JAX keeps the dtype
            import jax

            dtype = jax.dtypes.canonicalize_dtype(dtype)
        if arr is None or got[1] != shape or got[0] != dtype:
            what = "nothing" if arr is None else f"{got[0]} {got[1]}"
            raise SerializationError(
                f"{where}: the {fmt.name!r} format ({source_of(fmt)}) read array {key!r} as "
                f"{what}, but the checkpoint stores {dtype} {shape}; the format's "
                "read_arrays() is wrong (report it to its authors)"
            )
    return dict(arrays)


def check_written(fmt: Format, path: Path, *, publishing: bool) -> None:
    """Refuse what a format's ``write`` made at ``path`` if it breaks the contract."""
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


#: Limits for opening a checkpoint export has just written (its own bytes): none binds.
_WRITTEN_LIMITS = Limits(
    max_manifest_bytes=1 << 62,
    max_depth=1 << 62,
    max_nodes=1 << 62,
    max_array_bytes=1 << 62,
    max_inflation_ratio=1 << 62,
)


def check_contents(fmt: Format, path: Path, manifest: bytes) -> None:
    """Refuse what ``fmt``'s ``write`` made at ``path`` unless, opened with ``fmt``, it gives
    back the manifest and arrays table it was handed and holds those arrays (as its
    ``check_members`` says; no array data is read)."""
    where = repr(str(path))
    who = f"the {fmt.name!r} format ({source_of(fmt)})"
    expected = parse_manifest(manifest, where)
    try:
        opened = call_format(fmt, "open", where, lambda: fmt.open(path, _WRITTEN_LIMITS))
    except (SerializationError, OSError) as err:
        raise _not_as_given(where, who, f"opening it failed: {err}") from err
    try:
        if opened.manifest is None:
            raise _not_as_given(where, who, "it opens without a manifest")
        found = parse_manifest(opened.manifest, where)
        for part in ("manifest", "arrays"):
            if found.get(part) != expected.get(part):
                which = "value tree" if part == "manifest" else "arrays table"
                raise _not_as_given(where, who, f"its manifest's {which} is not the one given")
        table = {
            k: ArraySpec(*v)
            for k, v in check_arrays_table(found["arrays"], where, _WRITTEN_LIMITS).items()
        }
        try:
            call_format(fmt, "check_members", where, lambda: opened.check_members(table))
        except SerializationError as err:
            raise _not_as_given(where, who, f"it does not hold the arrays given: {err}") from err
    finally:
        opened.close()


def _not_as_given(where: str, who: str, what: str) -> SerializationError:
    return SerializationError(
        f"{where}: {who} wrote a checkpoint that does not hold what its write() was given "
        f"({what}); the previous checkpoint is kept and nothing was replaced. Report it to "
        "the format's authors"
    )
