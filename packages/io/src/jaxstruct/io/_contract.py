"""The format contract, checked: what a format wrote before it is published, what it read.

A format's bug must cost its user no checkpoint and no wrong data. Two checks sit
between a format and the user, each called from one place:

- :func:`check_written`: what a format's ``write`` made at its temporary, before
  export publishes it (export's step "check the written checkpoint");
- :func:`check_read`: what ``read_arrays`` returned (load's step "check the arrays
  read", through :func:`read_checked`).

jaxstruct-io's own formats check what they write and read themselves (every
member's CRC-32 and header against the arrays table), so export and load call
neither for them. A format's exception that is not ours (nor an ``OSError``)
becomes a ``SerializationError`` naming the format, its plugin and distribution
(:func:`format_failed`), chained.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from jaxstruct.registry import SerializationError, StructError

from ._formats import ArraySpec, Format, OpenedCheckpoint
from ._plugins import PluginError, current_registry
from ._schema import Limits, check_arrays_table, parse_manifest

T = TypeVar("T")


def source_of(fmt: Format) -> str:
    """The plugin and distribution (or description) that registered ``fmt``, for messages."""
    try:
        return current_registry().describe_source("format", fmt.name)
    except (KeyError, PluginError):
        return type(fmt).__module__


def format_failed(
    fmt: Format, method: str, where: str, err: BaseException, kept: str = ""
) -> SerializationError:
    """The error for ``fmt``'s ``method`` raising ``err`` (an exception not of ours): it names
    the format, its plugin and distribution; ``kept`` ends the message (what was left)."""
    return SerializationError(
        f"{where}: the {fmt.name!r} format ({source_of(fmt)}) failed in {method}() "
        f"({type(err).__name__}: {err}){kept}"
    )


def call_format(fmt: Format, method: str, where: str, call: Callable[[], T], kept: str = "") -> T:
    """Run ``call`` (``fmt``'s ``method``); an exception of the format's own (not an
    ``OSError`` or one of ours) becomes :func:`format_failed`'s error, chained."""
    try:
        return call()
    except (OSError, StructError):
        raise
    except Exception as err:
        raise format_failed(fmt, method, where, err, kept) from err


def owns_failed(fmt: Format, path: Path, err: BaseException) -> SerializationError:
    """The error for ``fmt.owns(path)`` raising during ``export(..., overwrite=True)``."""
    return format_failed(
        fmt,
        "owns",
        repr(str(path)),
        err,
        ", asked whether this is one of its checkpoints, which overwrite=True would replace; "
        "nothing was replaced. Report it to the format's authors, or export to another path",
    )


# -- check the written checkpoint ------------------------------------------------------


def check_written(fmt: Format, at: Path, manifest: bytes, *, replacing: bool) -> None:
    """Refuse what ``fmt``'s ``write`` made at the temporary ``at`` if it breaks the contract.

    It must exist, be a directory exactly when the format says so, and be recognised
    by the format's own ``sniff``; ``replacing`` a previous checkpoint, it must also
    give back, opened with the format, the manifest and arrays table it was handed,
    and hold those arrays (as its ``check_members`` says; no array data is read).

    Raises:
        SerializationError: naming the format, its plugin and distribution; the
            previous checkpoint is kept and nothing was replaced.
    """
    who = f"the {fmt.name!r} format ({source_of(fmt)})"
    where = repr(str(at))
    try:
        _check_written(fmt, at, manifest, replacing=replacing, where=where, who=who)
    except OSError as err:  # reading it back failed: unchecked, it is not published
        raise SerializationError(
            f"{where}: what {who} wrote could not be checked ({err}); nothing was replaced"
        ) from err


def _check_written(
    fmt: Format, at: Path, manifest: bytes, *, replacing: bool, where: str, who: str
) -> None:
    kept = "; nothing was replaced"
    try:
        mode = os.lstat(at).st_mode
    except FileNotFoundError:
        raise SerializationError(
            f"{where}: {who} returned from write() without creating the checkpoint{kept}; "
            "a format's write() must create the path it is given"
        ) from None
    made = "directory" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "special file"
    declared = "directory" if fmt.is_directory else "file"
    if made != declared:
        raise SerializationError(
            f"{where}: {who} declares is_directory={fmt.is_directory}, but its write() "
            f"created a {made}{kept}; the format must create a {declared} (or declare "
            f"is_directory={not fmt.is_directory})"
        )
    if type(fmt).sniff is not Format.sniff:
        recognised = call_format(fmt, "sniff", where, lambda: fmt.sniff(at), kept)
        if not recognised:
            raise SerializationError(
                f"{where}: {who} does not recognise (sniff) what its own write() created"
                f"{kept}; sniff() must recognise a checkpoint by its content, whatever its name"
            )
    if replacing:
        _check_contents(fmt, at, manifest, where, who)


#: Limits for opening a checkpoint export has just written (its own bytes): none binds.
_WRITTEN_LIMITS = Limits(
    max_manifest_bytes=1 << 62,
    max_depth=1 << 62,
    max_nodes=1 << 62,
    max_array_bytes=1 << 62,
    max_inflation_ratio=1 << 62,
)


def _check_contents(fmt: Format, at: Path, manifest: bytes, where: str, who: str) -> None:
    """Refuse what ``fmt`` wrote at ``at`` unless, opened with ``fmt``, it gives back the
    manifest and arrays table it was handed and holds those arrays."""
    expected = parse_manifest(manifest, where)
    try:
        opened = call_format(fmt, "open", where, lambda: fmt.open(at, _WRITTEN_LIMITS))
    except (SerializationError, OSError) as err:
        raise _not_as_given(where, who, f"opening it failed: {err}") from err
    try:
        if opened.manifest is None:
            raise _not_as_given(where, who, "it opens without a manifest")
        try:
            found = parse_manifest(opened.manifest, where)
        except SerializationError as err:  # its seal no longer matches: changed
            raise _not_as_given(where, who, f"its manifest is not the one given: {err}") from err
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


# -- check the arrays read -------------------------------------------------------------


def read_checked(
    fmt: Format,
    opened: OpenedCheckpoint,
    table: Mapping[str, Any],
    wanted: Mapping[str, Any],
    where: str,
) -> dict[str, Any]:
    """Call ``opened.read_arrays`` and check what it returned (:func:`check_read`): how every
    format but jaxstruct-io's own is read, by load, partial restore, ``inspect --verify``
    and the loads of files without a manifest."""
    arrays = call_format(fmt, "read_arrays", where, lambda: opened.read_arrays(table, wanted))
    return check_read(fmt, arrays, table, wanted, where)


def check_read(
    fmt: Format,
    arrays: Any,
    table: Mapping[str, Any],
    wanted: Mapping[str, Any],
    where: str,
) -> dict[str, Any]:
    """Refuse what ``read_arrays`` returned unless it is every wanted array with the stored
    shape and dtype: a format's bug never reaches the user as wrong data or a foreign
    exception.

    Raises:
        SerializationError: naming the format, its plugin and distribution, and the array.
    """
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
