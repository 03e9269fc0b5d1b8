"""The plugin registry: formats and codecs collected through pluggy hooks.

Built-in formats are a plugin like any other (registered without an entry
point). Entry points of the ``jaxstruct.io`` group are loaded the first time a
format or codec is needed, once per process, unless the environment variable
``JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD`` is set to a non-empty value.

An entry-point plugin whose hook would silently never run is refused with a
:class:`PluginError` naming the plugin and the hook: a function marked with
:data:`hookimpl` under a name that is not a hook (a misspelling), or a
``jaxstruct_*`` function without our marker (none, or another project's).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, cast

import pluggy
from jaxstruct.registry import StructError

from . import hookspecs
from ._codecs import Codec
from ._formats import DirectoryFormat, Format, ZipFormat

__all__ = [
    "AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "PluginError",
    "PluginRegistry",
    "current_registry",
    "hookimpl",
    "register_codec",
    "register_format",
]

ENTRY_POINT_GROUP = "jaxstruct.io"
AUTOLOAD_ENV = "JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD"
BUILTIN = "jaxstruct-io (built-in)"
_RUNTIME = "runtime registration: "

hookimpl = pluggy.HookimplMarker("jaxstruct")

_PROJECT = "jaxstruct"
_HOOK_PREFIX = "jaxstruct_"
#: The hook names a plugin may implement (those of :mod:`jaxstruct.io.hookspecs`).
_HOOK_NAMES = tuple(
    sorted(
        name
        for name, value in vars(hookspecs).items()
        if name.startswith(_HOOK_PREFIX) and hasattr(value, f"{_PROJECT}_spec")
    )
)


class PluginError(StructError, RuntimeError):
    """A plugin cannot be loaded, or two plugins register the same name."""


class _Builtins:
    """The built-in formats, registered through the same hook as any plugin."""

    @hookimpl
    def jaxstruct_register_formats(self) -> list[Format]:
        return [DirectoryFormat(), ZipFormat()]


class _Single:
    """A plugin wrapping one object given to :func:`register_codec` or :func:`register_format`."""

    def __init__(self, codec: Codec | None = None, fmt: Format | None = None) -> None:
        self.codec = codec
        self.fmt = fmt

    @hookimpl
    def jaxstruct_register_codecs(self) -> list[Codec]:
        return [self.codec] if self.codec is not None else []

    @hookimpl
    def jaxstruct_register_formats(self) -> list[Format]:
        return [self.fmt] if self.fmt is not None else []


def _dist_name(entry_point: Any) -> str:
    dist = getattr(entry_point, "dist", None)
    name = getattr(dist, "name", None) or getattr(
        getattr(dist, "metadata", {}), "get", lambda _k: None
    )("Name")
    return str(name) if name else f"<unknown distribution of entry point {entry_point.name!r}>"


class PluginRegistry:
    """Formats and codecs from a plugin manager, collected once and lazily.

    Args:
        entry_points: callable returning the entry points to load (default:
            the installed ``jaxstruct.io`` group); tests pass fakes.
        autoload: whether to load entry points; default: unless
            ``JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD`` is set.

    Example:
        >>> reg = PluginRegistry(entry_points=lambda: [])
        >>> sorted(reg.formats)
        ['directory', 'zip']
    """

    def __init__(
        self,
        *,
        entry_points: Callable[[], Iterable[Any]] | None = None,
        autoload: bool | None = None,
    ) -> None:
        self.manager = pluggy.PluginManager("jaxstruct")
        self.manager.add_hookspecs(hookspecs)
        self.manager.register(_Builtins(), name="jaxstruct-io-builtins")
        self._sources: dict[str, str] = {"jaxstruct-io-builtins": BUILTIN}
        self._entry_points = entry_points or (
            lambda: importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        )
        self._autoload = (not os.environ.get(AUTOLOAD_ENV)) if autoload is None else autoload
        self._lock = threading.RLock()
        self._loaded = False
        self._formats: dict[str, tuple[Format, str]] = {}
        self._codecs: dict[str, tuple[Codec, str]] = {}
        self._by_type: dict[type, Codec] = {}
        self._counter = 0

    # -- loading -----------------------------------------------------------------

    def _ensure(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            if self._autoload:
                self._load_entry_points()
            for plugin_name, source in list(self._sources.items()):
                self._collect(self.manager.get_plugin(plugin_name), plugin_name, source)
            self._loaded = True

    def _load_entry_points(self) -> None:
        for ep in self._entry_points():
            source = _dist_name(ep)
            try:
                plugin = ep.load()
            except Exception as err:
                raise PluginError(
                    f"jaxstruct.io plugin {ep.name!r} from distribution {source!r} failed to "
                    f"import ({type(err).__name__}: {err}); fix or uninstall it, or set "
                    f"{AUTOLOAD_ENV}=1 to skip plugin autoloading"
                ) from err
            name = f"entrypoint:{ep.name}"
            if self.manager.get_plugin(name) is plugin:
                # The same entry point loaded again (a registry reset): nothing new.
                continue
            if self.manager.has_plugin(name) or self.manager.is_registered(plugin):
                raise PluginError(
                    f"jaxstruct.io plugin {ep.name!r} from {source!r} is registered twice; "
                    "each entry point name must be unique"
                )
            _check_hooks(plugin, ep.name, source)
            try:
                self.manager.register(plugin, name=name)
            except pluggy.PluginValidationError as err:
                raise PluginError(
                    f"jaxstruct.io plugin {ep.name!r} from {source!r} has a hook implementation "
                    f"that does not fit its hook specification: {err}; its arguments must be "
                    "named as in jaxstruct.io.hookspecs (or taken away)"
                ) from None
            self._sources[name] = source

    def _collect(self, plugin: Any, plugin_name: str, source: str) -> None:
        for hook, table, kind in (
            (self.manager.hook.jaxstruct_register_formats, self._formats, "format"),
            (self.manager.hook.jaxstruct_register_codecs, self._codecs, "codec"),
        ):
            for impl in hook.get_hookimpls():
                if impl.plugin_name != plugin_name:
                    continue
                try:
                    items = list(cast("Iterable[Any]", impl.function() or ()))
                except Exception as err:
                    raise PluginError(
                        f"the {kind} hook of plugin {plugin_name!r} ({source}) failed "
                        f"({type(err).__name__}: {err})"
                    ) from err
                for item in items:
                    self._add(kind, table, item, source)

    def _add(self, kind: str, table: dict[str, Any], item: Any, source: str) -> None:
        expected = Format if kind == "format" else Codec
        if not isinstance(item, expected):
            raise PluginError(
                f"plugin from {source} returned {item!r} from its {kind} hook; expected "
                f"{expected.__name__} instances"
            )
        name = item.name
        if not name:
            raise PluginError(f"{kind} {item!r} from {source} has an empty name")
        if name in table and table[name][1] == source and source.startswith(_RUNTIME):
            # The same register_*() call site running again (a re-run notebook
            # cell) replaces its earlier registration instead of clashing.
            previous = table.pop(name)[0]
            for cls in getattr(previous, "types", ()):
                self._by_type.pop(cls, None)
        if name in table:
            raise PluginError(
                f"{kind} name {name!r} is registered by both {table[name][1]!r} and {source!r}; "
                "uninstall one of them, or rename one of the registrations"
            )
        if isinstance(item, Codec):
            for cls in item.types:
                if cls in self._by_type:
                    other = self._by_type[cls].name
                    raise PluginError(
                        f"codec {name!r} from {source!r} and codec {other!r} from "
                        f"{self._codecs[other][1]!r} both handle {cls.__qualname__}"
                    )
            for cls in item.types:
                self._by_type[cls] = item
        table[name] = (item, source)

    def _register_single(self, plugin: _Single, what: str) -> None:
        with self._lock:
            self._counter += 1
            caller = sys._getframe(2).f_globals.get("__name__", "?")
            name = f"runtime:{what}:{self._counter}"
            source = f"{_RUNTIME}{what}() called from {caller}"
            self.manager.register(plugin, name=name)
            self._sources[name] = source
            if self._loaded:
                try:
                    self._collect(plugin, name, source)
                except PluginError:
                    self.manager.unregister(name=name)
                    del self._sources[name]
                    raise

    # -- queries -----------------------------------------------------------------

    @property
    def formats(self) -> dict[str, Format]:
        """Every registered format by name."""
        self._ensure()
        return {name: fmt for name, (fmt, _) in self._formats.items()}

    @property
    def codecs(self) -> dict[str, Codec]:
        """Every registered codec by name."""
        self._ensure()
        return {name: codec for name, (codec, _) in self._codecs.items()}

    def source_of(self, kind: str, name: str) -> str:
        """Return the distribution (or description) that registered a format or codec."""
        self._ensure()
        table = self._formats if kind == "format" else self._codecs
        return table[name][1]

    def codec_for_type(self, cls: type) -> Codec | None:
        """Return the codec handling exactly ``cls``, or ``None``."""
        self._ensure()
        return self._by_type.get(cls)

    def codec_named(self, name: str) -> Codec | None:
        """Return the codec registered under ``name``, or ``None``."""
        self._ensure()
        entry = self._codecs.get(name)
        return entry[0] if entry else None


def _impl_markers(function: Any) -> list[str]:
    """The projects whose pluggy hookimpl marker ``function`` carries (``<project>_impl``)."""
    found = []
    for attr, value in getattr(function, "__dict__", {}).items():
        if attr.endswith("_impl") and isinstance(value, dict):
            found.append(attr[: -len("_impl")])
    return sorted(found)


def _check_hooks(plugin: Any, ep_name: str, source: str) -> None:
    """Refuse a plugin with a hook pluggy would silently skip: unknown, or without our marker.

    pluggy registers a marked function under any name (an unknown hook only
    shows up in ``check_pending``) and ignores a ``jaxstruct_*`` function that
    lacks our marker; either way the plugin's author would never learn that
    the hook does not run.

    Raises:
        PluginError: naming the plugin, its distribution and the hook.
    """
    who = f"jaxstruct.io plugin {ep_name!r} from {source!r}"
    hooks = ", ".join(_HOOK_NAMES)
    for name in dir(plugin):
        try:
            function = getattr(plugin, name)
        except Exception:  # a property that fails; pluggy skips those too
            continue
        if not inspect.isroutine(function):
            continue
        markers = _impl_markers(function)
        if _PROJECT in markers:
            if name not in _HOOK_NAMES:
                close = difflib.get_close_matches(name, _HOOK_NAMES, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise PluginError(
                    f"{who} implements {name!r}, which is not a jaxstruct.io hook; {hint}"
                    f"rename it to one of: {hooks}"
                )
        elif name.startswith(_HOOK_PREFIX) and not hasattr(function, f"{_PROJECT}_spec"):
            what = (
                f"carries the hookimpl marker of {', '.join(map(repr, markers))} instead of "
                "jaxstruct's"
                if markers
                else "has no hookimpl marker"
            )
            raise PluginError(
                f"{who} defines {name!r}, which {what}, so it would never run; decorate it "
                "with @jaxstruct.io.hookimpl (or rename it if it is not meant as a hook)"
            )


_registry: PluginRegistry | None = None
_registry_lock = threading.Lock()


def current_registry() -> PluginRegistry:
    """Return the process-wide registry, creating it on first use."""
    global _registry
    if _registry is None:
        with _registry_lock:
            if _registry is None:
                _registry = PluginRegistry()
    return _registry


def register_codec(codec: Codec) -> Codec:
    """Register a value codec in this process, as if a plugin provided it.

    Args:
        codec: the codec; its name and types must not clash with another codec.

    Returns:
        ``codec``.

    Registering a codec of the same name again from the same module replaces
    the earlier one (so re-running a notebook cell works).

    Raises:
        PluginError: the name or one of the types is already taken by another
            plugin or module.

    Example:
        >>> class Celsius(float): ...
        >>> _ = register_codec(Codec("doctest.celsius", (Celsius,), encode=float, decode=Celsius))
        >>> from jaxstruct.io import from_state_dict, to_state_dict
        >>> from_state_dict(to_state_dict(Celsius(21.5)))
        21.5
    """
    if not isinstance(codec, Codec):
        raise TypeError(f"register_codec() expected a Codec, got {codec!r}")
    current_registry()._register_single(_Single(codec=codec), "register_codec")
    return codec


def register_format(fmt: Format) -> Format:
    """Register an on-disk format in this process, as if a plugin provided it.

    Args:
        fmt: a :class:`Format` instance with a unique name.

    Returns:
        ``fmt``.

    Raises:
        PluginError: the name is already taken.

    Example:
        >>> class Tar(Format):
        ...     name = "doctest-tar"
        ...     suffixes = (".doctest-tar",)
        >>> _ = register_format(Tar())
        >>> "doctest-tar" in current_registry().formats
        True
    """
    if not isinstance(fmt, Format):
        raise TypeError(f"register_format() expected a Format instance, got {fmt!r}")
    current_registry()._register_single(_Single(fmt=fmt), "register_format")
    return fmt
