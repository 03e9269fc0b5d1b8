"""What a plugin hands jaxstruct, checked before anything of it is used: its hooks and items."""

from __future__ import annotations

import difflib
import enum
import inspect
import pathlib
import sys
from typing import Any

import numpy as np

from . import hookspecs
from ._formats import Format
from ._tables import Key
from ._values import Codec

_PROJECT = "jaxstruct"
_HOOK_PREFIX = "jaxstruct_"
#: The hook names a plugin may implement (those of :mod:`jaxstruct.io.hookspecs`).
HOOK_NAMES = tuple(sorted(name for name in hookspecs.__all__ if name.startswith(_HOOK_PREFIX)))


def native_reason(cls: type) -> str | None:
    """Why values of ``cls`` never reach a codec (they are stored natively), or ``None``."""
    from jaxstruct.registry import is_registered_pytree_type

    native = (type(None), bool, int, float, complex, str, bytes, list, tuple, set, frozenset, dict)
    paths = (pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.PosixPath, pathlib.WindowsPath)
    if cls in native or cls in paths or cls is np.ndarray or issubclass(cls, np.generic):
        return f"{cls.__qualname__} values are stored natively"
    if issubclass(cls, enum.Enum):
        return "enum members are stored natively (by class and member name)"
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return "namedtuples are stored natively (by class and fields)"
    jax = sys.modules.get("jax")
    if jax is not None and issubclass(cls, jax.Array):
        return "JAX arrays are stored natively"
    if is_registered_pytree_type(cls):
        return f"{cls.__qualname__} is a registered pytree type (or Struct), stored by its fields"
    return None


def check_item(item: Any, kind: str) -> str | None:
    """What is wrong with an item a hook returned, or ``None`` (never raises)."""
    try:
        return _check_item(item, kind)
    except Exception as err:  # a property of the plugin's object that fails
        return (
            f"reading its {kind} {type(item).__qualname__}'s attributes raised "
            f"{type(err).__name__}: {err}; its name and suffixes (or types) must be readable"
        )


def _check_item(item: Any, kind: str) -> str | None:
    expected = Format if kind == "format" else Codec
    if isinstance(item, type):
        return (
            f"its {kind} hook returned the class {item.__qualname__} instead of an instance; "
            f"return {item.__qualname__}()"
        )
    if not isinstance(item, expected):
        return f"its {kind} hook returned {item!r}; expected {expected.__name__} instances"
    name = item.name
    if not isinstance(name, str) or not name:
        return f"its {kind} hook returned {item!r} with an empty name"
    if isinstance(item, Format):
        suffixes = item.suffixes
        if isinstance(suffixes, str) or not all(
            isinstance(s, str) and s.startswith(".") and len(s) > 1 for s in suffixes
        ):
            return (
                f"format {name!r} has suffixes {suffixes!r}; expected a tuple of strings "
                "starting with '.' ((\".h5\",))"
            )
        for suffix in suffixes:
            if "." in suffix[1:]:
                last = "." + suffix.rsplit(".", 1)[1]
                return (
                    f"format {name!r} claims the suffix {suffix!r}, which export never picks: "
                    f"a path's format is chosen by its last suffix only ({last!r}); claim "
                    f"{last!r} instead and tell the files apart in sniff()"
                )
    else:
        for cls in item.types:
            reason = native_reason(cls)
            if reason is not None:
                return (
                    f"codec {name!r} handles {cls.__qualname__}, but {reason}: it would never run"
                )
    return None


def claimed_by_broken(item: Any, kind: str) -> list[Key]:
    """The names a refused item would have claimed, where they can be read (class attributes)."""
    try:
        return _claimed_by_broken(item, kind)
    except Exception:  # unreadable: it claims nothing we can name
        return []


def _claimed_by_broken(item: Any, kind: str) -> list[Key]:
    name = getattr(item, "name", None)
    if not isinstance(name, str) or not name:
        return []
    keys: list[Key] = [(kind, name)]
    if kind == "format":
        suffixes = getattr(item, "suffixes", ())
        if isinstance(suffixes, (tuple, list)):
            keys += [("suffix", s.lower()) for s in suffixes if isinstance(s, str)]
    return keys


def check_hooks(plugin: Any) -> str | None:
    """Refuse a plugin with a hook pluggy would silently skip: unknown, or without our marker.

    Never raises: a plugin whose attributes cannot be listed or read is refused.
    """
    try:
        return _check_hooks(plugin)
    except Exception as err:
        return (
            f"reading its attributes raised {type(err).__name__}: {err}; a plugin module's "
            "__getattr__ must raise AttributeError for names it does not have"
        )


def _check_hooks(plugin: Any) -> str | None:
    hooks = ", ".join(HOOK_NAMES)
    for name in dir(plugin):
        try:
            function = getattr(plugin, name)
        except Exception:  # a property that fails; pluggy skips those too
            continue
        if not inspect.isroutine(function):
            continue
        # The projects whose pluggy hookimpl marker it carries (``<project>_impl``).
        markers = sorted(
            attr.removesuffix("_impl")
            for attr, value in getattr(function, "__dict__", {}).items()
            if attr.endswith("_impl") and isinstance(value, dict)
        )
        if _PROJECT in markers:
            if name not in HOOK_NAMES:
                close = difflib.get_close_matches(name, HOOK_NAMES, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                return (
                    f"it implements {name!r}, which is not a jaxstruct.io hook; {hint}"
                    f"rename it to one of: {hooks}"
                )
        elif name.startswith(_HOOK_PREFIX) and not hasattr(function, f"{_PROJECT}_spec"):
            what = (
                f"carries the hookimpl marker of {', '.join(map(repr, markers))} instead of "
                "jaxstruct's"
                if markers
                else "has no hookimpl marker"
            )
            return (
                f"it defines {name!r}, which {what}, so it would never run; decorate it "
                "with @jaxstruct.io.hookimpl (or rename it if it is not meant as a hook)"
            )
    return None
