"""The format contract, checked: what a format wrote before it is published, what it read.

A format's bug must cost its user no checkpoint and no wrong data. Two checks sit
between a format and the user, each called from one place:

- :func:`check_written`: what a format's ``write`` made at its temporary, before
  export publishes it (export's step "check the written checkpoint"): opened with the
  format, it must give back the manifest it was given and hold every array, as the
  format's ``check_members`` says, else read back and checked against the manifest's
  checksums;
- :func:`check_read`: what ``read_arrays`` returned (load's step "check the arrays
  read", through :func:`read_checked`): every wanted array, with the stored shape and
  dtype, and the CRC-32s jaxstruct recorded for a format that keeps none of its own
  (:func:`expected_checks`).

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

from ._formats import ArraySpec, Format, OpenedCheckpoint, place
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


def check_written(fmt: Format, at: Path, manifest: bytes) -> None:
    """Refuse what ``fmt``'s ``write`` made at the temporary ``at`` if it breaks the contract.

    It must exist, be a directory exactly when the format says so, be recognised by
    the format's own ``sniff``, and, opened with the format, give back the manifest
    it was handed and hold every array: as its ``check_members`` says (no array data
    read), or, for a format without one, read back one array at a time and checked
    (against jaxstruct's CRC-32s, or by the format's own checks).

    Raises:
        SerializationError: naming the format, its plugin and distribution; the
            previous checkpoint is kept and nothing was replaced.
    """
    who = f"the {fmt.name!r} format ({source_of(fmt)})"
    where = repr(str(at))
    try:
        _check_written(fmt, at, manifest, where=where, who=who)
    except OSError as err:  # reading it back failed: unchecked, it is not published
        raise SerializationError(
            f"{where}: what {who} wrote could not be checked ({err}); nothing was replaced"
        ) from err


def _check_written(fmt: Format, at: Path, manifest: bytes, *, where: str, who: str) -> None:
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
    if type(fmt).open is not Format.open:  # a write-only format: nothing jaxstruct loads
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
    manifest it was handed and holds every array (see :func:`check_written`)."""
    given = parse_manifest(manifest, where)
    try:
        opened = call_format(fmt, "open", where, lambda: fmt.open(at, _WRITTEN_LIMITS))
    except (SerializationError, OSError) as err:
        raise _not_as_given(where, who, f"opening it failed: {err}") from err
    try:
        if opened.manifest is None:
            raise _not_as_given(where, who, "it opens without a manifest")
        if bytes(opened.manifest).rstrip() != manifest.rstrip():
            raise _not_as_given(where, who, _how_it_differs(opened.manifest, given, where))
        table = {
            k: ArraySpec(*v)
            for k, v in check_arrays_table(given["arrays"], where, _WRITTEN_LIMITS).items()
        }
        try:
            if type(opened).check_members is not OpenedCheckpoint.check_members:
                call_format(fmt, "check_members", where, lambda: opened.check_members(table))
            else:  # no cheaper proof: every array read back (from the page cache), checked
                checks = expected_checks(fmt, opened, given, table, where)
                for key in table:
                    read_checked(fmt, opened, table, {key: None}, where, checks=checks)
        except SerializationError as err:
            raise _not_as_given(where, who, f"it does not hold the arrays given: {err}") from err
    finally:
        opened.close()


def _how_it_differs(found: bytes, given: Mapping[str, Any], where: str) -> str:
    """Which part of the manifest a format gave back differs from the one it was given."""
    try:
        top = parse_manifest(found, where)
    except SerializationError as err:  # its seal no longer matches: changed
        return f"its manifest is not the one given: {err}"
    for part, which in (("manifest", "value tree"), ("arrays", "arrays table")):
        if top.get(part) != given.get(part):
            return f"its manifest's {which} is not the one given"
    return "its manifest's bytes are not the ones given"


def _not_as_given(where: str, who: str, what: str) -> SerializationError:
    return SerializationError(
        f"{where}: {who} wrote a checkpoint that does not hold what its write() was given "
        f"({what}); the previous checkpoint is kept and nothing was replaced. Report it to "
        "the format's authors"
    )


# -- check the arrays read -------------------------------------------------------------


def expected_checks(
    fmt: Format,
    opened: OpenedCheckpoint,
    top: Mapping[str, Any],
    table: Mapping[str, ArraySpec],
    where: str,
) -> Any:
    """How the arrays of a plugin format's opened checkpoint are checked as they are read:
    against the CRC-32s jaxstruct recorded (returned, to :func:`read_checked`), or by the
    format itself (``None``, once this file is known to carry its checksums: a manifest
    saying so on a file whose opened checkpoint does not is refused), or not at all
    (``None``: a manifest of format version 1, written before checksums).

    Raises:
        SerializationError: the manifest says the format checks the arrays and this
            opened file does not carry its checksums, or the recorded CRC-32s are
            malformed.
    """
    section = top.get("checksums")
    if section is None:
        return None
    if section.get("by") == "format":
        if getattr(opened, "arrays_checked", False) is not True:
            raise SerializationError(
                f"{where}: this checkpoint was written to be checked by the {fmt.name!r} "
                f"format ({source_of(fmt)}), and the opened file does not carry its checksums "
                "(arrays_checked is not set): they are missing or damaged, or the format's "
                "open() does not say so; restore the checkpoint from a copy, or report it to "
                "the format's authors"
            )
        return None
    from ._checksums import Expected
    from ._formats import array_paths

    return Expected(section, table, where, names=lambda: array_paths(top))


def read_checked(
    fmt: Format,
    opened: OpenedCheckpoint,
    table: Mapping[str, Any],
    wanted: Mapping[str, Any],
    where: str,
    *,
    checks: Any = None,
) -> dict[str, Any]:
    """Call ``opened.read_arrays`` and check what it returned (:func:`check_read`, and the
    CRC-32s ``checks`` holds, from :func:`expected_checks`): how every format but
    jaxstruct-io's own is read, by load, partial restore, ``inspect --verify``, export's
    check of what it wrote and the loads of files without a manifest.

    An array JAX would convert on its way to a device (float64 without x64) is read on
    the host, checked, then placed: its stored bytes are what the CRC-32s cover.
    """
    converted = {} if checks is None else _converted_on_placement(table, wanted)
    asked = {k: (None if k in converted else p) for k, p in wanted.items()}
    arrays = call_format(fmt, "read_arrays", where, lambda: opened.read_arrays(table, asked))
    arrays = check_read(fmt, arrays, table, asked, where)
    if checks is not None:
        checks.check({k: arrays[k] for k in wanted}, f"the {fmt.name!r} format ({source_of(fmt)})")
    for key, placement in converted.items():
        arrays[key] = place(arrays[key], placement)
    return arrays


def _converted_on_placement(table: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The placed arrays whose dtype JAX would change on a device, with their placement."""
    placed = {k: p for k, p in wanted.items() if p is not None}
    if not placed:
        return {}
    import jax

    return {
        k: p for k, p in placed.items() if jax.dtypes.canonicalize_dtype(table[k][0]) != table[k][0]
    }


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
