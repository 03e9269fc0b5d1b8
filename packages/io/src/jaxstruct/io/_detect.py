"""The format of a path: by suffix on export, recognised on load; the format contract checked."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxstruct.registry import SerializationError, StructError

from . import _fs
from ._builtin import DirectoryFormat, ZipFormat
from ._formats import Format, OpenedCheckpoint
from ._plugins import BLOCK_ENV, PluginError, current_registry
from ._schema import DEFAULT_LIMITS, Limits, parse_manifest

BUILTIN_TYPES = (DirectoryFormat, ZipFormat)


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
    return format_named("directory")


def _suffix_hint(registry: Any) -> str:
    claimed = sorted(registry.suffixes)
    more = registry.missing_hint()
    return f" (claimed: {', '.join(claimed)}){'; ' + more if more else ''}"


def _candidates(path: Any) -> list[Format]:
    """The formats whose ``sniff`` recognises ``path``, best first."""
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
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"{where}: no such checkpoint") from None
    mode = st.st_mode
    is_dir = stat.S_ISDIR(mode)
    if not is_dir and not stat.S_ISREG(mode):
        raise SerializationError(f"{where}: is not a regular file or directory")
    suffix = path.suffix.lower()
    try:
        owner = registry.format_for_suffix(suffix) if suffix else None
        owner_error: PluginError | None = None
    except PluginError as err:
        owner, owner_error = None, err
    if owner is not None and owner.is_directory == is_dir and sniffs(owner, path, []):
        return [owner]
    claimed = owner is not None or owner_error is not None
    formats = [f for f in registry.formats.values() if f.is_directory == is_dir]
    if not claimed:
        # The built-in formats recognise their files by content (a zip signature,
        # a manifest.json): one that does wins, whatever a plugin's sniff says.
        found = [f for f in formats if type(f) in BUILTIN_TYPES and sniffs(f, path)]
        if found:
            return found
    errors: list[str] = []
    found = [f for f in formats if type(f) not in BUILTIN_TYPES and sniffs(f, path, errors)]
    if claimed:
        # The suffix is another format's: only formats claiming it may read the path.
        found = [f for f in found if suffix in (s.lower() for s in f.suffixes)]
    if found:
        return found
    if owner_error is not None:
        raise owner_error
    try:
        now = os.stat(path)
    except OSError:
        now = None
    if now is None or (now.st_ino, now.st_dev, now.st_ctime_ns) != (
        st.st_ino,
        st.st_dev,
        st.st_ctime_ns,
    ):
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
        raise SerializationError(
            f"{where}: the {fmt.name!r} format ({source_of(fmt)}) failed to open it "
            f"({type(err).__name__}: {err})"
        ) from err
    if opened.manifest is None:  # a file another tool wrote (see ``_plain``)
        return opened, None
    try:
        top = parse_manifest(opened.manifest, where)
        container = top["container"]
        if container != fmt.name and container not in getattr(fmt, "also_reads", ()):
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


def open_any(
    path: Any, limits: Limits, format: str | None = None
) -> tuple[Format, OpenedCheckpoint, dict[str, Any] | None]:
    """:func:`open_checkpoint`, but a file without a manifest gives ``None`` for it."""
    if format is not None:
        fmt = format_named(format)
        return (fmt, *_open_checked(fmt, path, limits))
    found = _candidates(path)
    if len(found) == 1:
        fmt = found[0]
        try:
            return (fmt, *_open_checked(fmt, path, limits))
        except _ContainerMismatch as err:
            # A file of a format built on a built-in one (a zip-based container
            # without a claimed suffix): the format its manifest names reads it.
            other = current_registry().format_named(err.container)
            if other is None or other is fmt or not sniffs(other, path):
                raise
            return (other, *_open_checked(other, path, limits))
    matches: list[tuple[Format, OpenedCheckpoint, dict[str, Any] | None]] = []
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
    registry = current_registry()
    names = ", ".join(f"{f.name!r} ({registry.source_of('format', f.name)})" for f in found)
    raise PluginError(
        f"{str(path)!r}: several formats recognise this path and none claims its suffix: "
        f"{names}; one of them recognises files that are not its own: block its plugin with "
        f"{BLOCK_ENV}=<name>, or report it to its authors"
    )


def owns_checkpoint(fmt: Format, path: Path) -> bool:
    """Whether ``path`` is a checkpoint of ``fmt`` (which ``overwrite`` may replace): the
    format's cheap ``owns`` if it has one, else a full open."""
    owns = getattr(fmt, "owns", None)
    return bool(owns(path)) if owns is not None else is_checkpoint(path, fmt)


def is_checkpoint(path: Path, fmt: Format) -> bool:
    """Return whether ``path`` is a readable jaxstruct checkpoint of format ``fmt``."""
    try:
        found, opened, _ = open_checkpoint(path, DEFAULT_LIMITS)
    except (SerializationError, OSError):
        return False
    opened.close()
    return found.name == fmt.name


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
) -> None:
    """Call ``fmt.write`` and (with ``check``) check what it made against the format contract."""
    try:
        fmt.write(target, manifest, arrays, compression=compression, step=_fs.step)
    except (OSError, StructError):
        raise
    except Exception as err:
        raise SerializationError(
            f"{str(target)!r}: the {fmt.name!r} format ({source_of(fmt)}) failed in write() "
            f"({type(err).__name__}: {err}); nothing was replaced"
        ) from err
    if check and type(fmt) not in BUILTIN_TYPES and isinstance(target, Path):
        check_written(fmt, target, publishing=publishing)


def read_checked(
    fmt: Format,
    opened: OpenedCheckpoint,
    table: Mapping[str, Any],
    wanted: Mapping[str, Any],
    where: str,
) -> dict[str, Any]:
    """Call ``opened.read_arrays`` and (for a plugin's format) check that it gave every
    wanted array with the stored shape and dtype: a plugin's bug never reaches the user
    as wrong data or a foreign exception."""
    if type(fmt) in BUILTIN_TYPES:  # their readers check every member themselves
        return opened.read_arrays(table, wanted)
    who = f"the {fmt.name!r} format ({source_of(fmt)})"
    try:
        arrays = opened.read_arrays(table, wanted)
    except (OSError, StructError):
        raise
    except Exception as err:
        raise SerializationError(
            f"{where}: {who} failed in read_arrays() ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(arrays, Mapping):
        raise SerializationError(
            f"{where}: {who} returned {type(arrays).__name__} from read_arrays(); a format "
            "must return a dict of the wanted keys"
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
                f"{where}: {who} read array {key!r} as {what}, but the checkpoint stores "
                f"{dtype} {shape}; the format's read_arrays() is wrong (report it to its authors)"
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
