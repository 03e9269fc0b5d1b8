"""Plugins collected with pluggy, checked, and tabled: who provides which name, and clashes."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import importlib.metadata
import inspect
import os
import pathlib
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import pluggy
from jaxstruct.registry import StructError

from . import _process, hookspecs
from ._builtin import DirectoryFormat, ZipFormat
from ._formats import Format
from ._values import Codec

#: A name an item takes: ``("format" | "codec" | "suffix" | "type", name, suffix or class)``.
Key = tuple[str, Any]

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


#: Comma-separated entry-point or distribution names of plugins never to load.
BLOCK_ENV = "JAXSTRUCT_IO_BLOCK_PLUGINS"


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    """One plugin as the registry sees it (what ``jaxstruct plugins`` lists).

    Attributes:
        name: the entry-point name (``"jaxstruct-io-builtins"`` for the built-in
            formats, ``"register_codec()"``-style names for runtime registrations).
        distribution: the distribution that advertises it.
        version: that distribution's version (``""`` if unknown).
        state: ``"loaded"``, ``"failed"`` (nothing it provides is used) or
            ``"disabled"`` (blocked, or not in the allow list).
        reason: why it failed or is disabled (``""`` when loaded).
        formats: the format names it registers, with their suffixes
            (``"tar (.tar)"``).
        codecs: the codec names it registers.
        problems: names of it that clash with another plugin's, one message each.
    """

    name: str
    distribution: str
    version: str
    state: str
    reason: str = ""
    formats: tuple[str, ...] = ()
    codecs: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The same information as a JSON-ready dict."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        version = f" {self.version}" if self.version else ""
        head = f"{self.name} ({self.distribution}{version}): {self.state}"
        if self.reason:
            head += f": {self.reason}"
        lines = [head]
        if self.formats:
            lines.append(f"  formats: {', '.join(self.formats)}")
        if self.codecs:
            lines.append(f"  codecs: {', '.join(self.codecs)}")
        lines += [f"  problem: {problem}" for problem in self.problems]
        return "\n".join(lines)


class Origin(NamedTuple):
    """Who registered an item: a plugin (entry point) and its distribution."""

    plugin: str
    dist: str
    kind: str  # "builtin", "entrypoint" or "runtime"

    def __str__(self) -> str:
        if self.kind == "entrypoint":
            return f"plugin {self.plugin!r} from distribution {self.dist!r}"
        return repr(self.dist)


def claims_of(item: Format | Codec) -> list[Key]:
    """Every name ``item`` takes: its own name first, then its suffixes or codec types."""
    if isinstance(item, Format):
        # A suffix listed twice (".h5", ".H5") is one claim, not a clash with itself.
        suffixes = dict.fromkeys(s.lower() for s in item.suffixes)
        return [("format", item.name), *(("suffix", s) for s in suffixes)]
    return [("codec", item.name), *(("type", cls) for cls in item.types)]


def key_text(key: Key) -> str:
    kind, value = key
    if kind == "type":
        return f"codec type {value.__module__}.{value.__qualname__}"
    if kind == "suffix":
        return f"suffix {value!r}"
    return f"{kind} name {value!r}"


class Tables:
    """One collection of every plugin: who owns which name, and which names are conflicted."""

    def __init__(self) -> None:
        self.owners: dict[Key, tuple[Any, Origin]] = {}
        self.broken: dict[Key, str] = {}
        self.plugins: list[PluginInfo] = []
        self.messages: list[str] = []
        #: ``kind -> {name, suffix or class -> item}``, rebuilt from ``owners`` by refresh().
        self.views: dict[str, dict[Any, Any]] = {}
        #: Clashes found after a plugin was listed, by the earlier plugin's name.
        self.later_problems: dict[str, list[str]] = {}

    def _note_clash(self, first: Origin, message: str) -> None:
        """The clash is the earlier plugin's problem too (it is listed already)."""
        if first.kind == "entrypoint":
            self.later_problems.setdefault(first.plugin, []).append(message)

    def finish(self) -> None:
        """Add each clash to the listing of the earlier plugin it involves."""
        for i, info in enumerate(self.plugins):
            more = self.later_problems.get(info.name)
            if more and info.state == "loaded":
                problems = tuple(dict.fromkeys((*info.problems, *more)))
                self.plugins[i] = dataclasses.replace(info, problems=problems)

    def refresh(self) -> None:
        self.views = {"format": {}, "codec": {}, "type": {}, "suffix": {}}
        for (kind, value), (item, _) in self.owners.items():
            self.views[kind][value] = item

    def drop(self, item: Any) -> list[Key]:
        """Remove every claim of ``item``; return the names it held."""
        keys = [k for k, (owner, _) in self.owners.items() if owner is item]
        for key in keys:
            del self.owners[key]
        return keys

    def merge(self, item: Format | Codec, origin: Origin) -> list[str]:
        """Add ``item`` (already checked); return one message per clash it ran into."""
        claims = claims_of(item)
        problems: list[str] = []
        name_key = claims[0]
        if name_key in self.broken:
            message = f"{self.broken[name_key]}; {origin} registers it too"
            for key in claims:
                self.broken.setdefault(key, message)
            self.broken[name_key] = message
            return [message]
        other = self.owners.get(name_key)
        if other is not None:
            message = clash(name_key, other[1], origin)
            self._note_clash(other[1], message)
            if other[1].kind == "entrypoint":
                for key in self.drop(other[0]):
                    self.broken[key] = message
                for key in claims:
                    self.broken.setdefault(key, message)
            return [message]
        self.owners[name_key] = (item, origin)
        for key in claims[1:]:
            if key in self.broken:
                self.broken[key] = f"{self.broken[key]}; {origin} claims it too"
                problems.append(self.broken[key])
                continue
            other = self.owners.get(key)
            if other is None:
                self.owners[key] = (item, origin)
                continue
            message = clash(key, other[1], origin)
            problems.append(message)
            self._note_clash(other[1], message)
            if other[1].kind == "entrypoint":
                del self.owners[key]
                self.broken[key] = message
        return problems


def clash(key: Key, first: Origin, second: Origin) -> str:
    fix = (
        f"uninstall one of them, or block one with {BLOCK_ENV}=<plugin or distribution name>"
        if first.kind == "entrypoint"
        else f"the {'built-in' if first.kind == 'builtin' else 'registered'} one is kept"
    )
    return f"{key_text(key)} is registered by both {first} and {second}; {fix}"


def plugin_info(
    name: str,
    dist: str,
    version: str,
    state: str,
    items: Sequence[Format | Codec] = (),
    *,
    reason: str = "",
    problems: Iterable[str] = (),
) -> PluginInfo:
    formats = [f for f in items if isinstance(f, Format)]
    return PluginInfo(
        name=str(name),
        distribution=dist,
        version=version,
        state=state,
        reason=reason,
        formats=tuple(
            f"{f.name} ({', '.join(f.suffixes)})" if f.suffixes else f.name for f in formats
        ),
        codecs=tuple(c.name for c in items if isinstance(c, Codec)),
        problems=tuple(problems),
    )


ENTRY_POINT_GROUP = "jaxstruct.io"
#: Set to ``1`` (or ``true``, ``yes``, ``on``, any value but ``0``, ``false``,
#: ``no``, ``off`` and the empty string) to load no entry-point plugin at all.
AUTOLOAD_ENV = "JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD"
#: Comma-separated entry-point or distribution names: when set, only these load.
ALLOW_ENV = "JAXSTRUCT_IO_LOAD_PLUGINS"
#: The plugin interface version this jaxstruct-io provides. A plugin module may
#: declare the version it was written for as ``JAXSTRUCT_IO_PLUGIN_API = 1``;
#: a plugin declaring a newer one is failed with a message asking for an upgrade.
PLUGIN_API_VERSION = 1
API_ATTRIBUTE = "JAXSTRUCT_IO_PLUGIN_API"
_BUILTIN_PLUGIN = "jaxstruct-io-builtins"
_RUNTIME = "runtime registration: "
_OFF_VALUES = frozenset({"", "0", "false", "no", "off"})

hookimpl = pluggy.HookimplMarker("jaxstruct")


class PluginError(StructError, RuntimeError):
    """A plugin cannot be loaded, or two plugins register the same name."""


class PluginWarning(UserWarning):
    """A plugin was skipped (it failed, or lost a name to a clash); the rest keep working."""


class _Refused(PluginError):
    """Why a plugin is not used (the message), and the names it would have claimed."""

    def __init__(self, reason: str, claimed: list[Key] | None = None) -> None:
        super().__init__(reason)
        self.claimed = claimed or []


def autoload_enabled() -> bool:
    """Whether entry-point plugins are loaded, as :data:`AUTOLOAD_ENV` says."""
    return os.environ.get(AUTOLOAD_ENV, "").strip().lower() in _OFF_VALUES


def _names_from_env(var: str) -> frozenset[str] | None:
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return None
    return frozenset(_normal(part) for part in raw.split(",") if part.strip())


def _normal(name: str) -> str:
    """Entry-point and distribution names compared as packaging does (``A_b.c`` is ``a-b-c``)."""
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


class _Builtins:
    """The built-in formats, registered through the same hook as any plugin."""

    @hookimpl
    def jaxstruct_register_formats(self) -> list[Format]:
        return [DirectoryFormat(), ZipFormat()]


def _dist_of(entry_point: Any) -> tuple[str, str]:
    """``(distribution name, version)`` of an entry point (placeholders when unknown)."""
    dist = getattr(entry_point, "dist", None)
    name = (
        getattr(dist, "name", None) or f"<unknown distribution of entry point {entry_point.name!r}>"
    )
    version = getattr(dist, "version", None)
    return str(name), str(version) if version else ""


def _own_version() -> str:
    try:
        return importlib.metadata.version("jaxstruct-io")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - always installed
        return ""


class PluginRegistry:
    """Formats and codecs from a plugin manager, collected once and lazily.

    Args:
        entry_points: callable returning the entry points to load (default:
            the installed ``jaxstruct.io`` group); tests pass fakes.
        autoload: whether to load entry points; default: unless
            :data:`AUTOLOAD_ENV` is set (to anything but ``0``, ``false``,
            ``no``, ``off`` or nothing).
        block: entry-point or distribution names never to load; default:
            :data:`BLOCK_ENV`, comma-separated.
        allow: if given, only these entry-point or distribution names load;
            default: :data:`ALLOW_ENV`, comma-separated (unset: all).

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
        block: Iterable[str] | None = None,
        allow: Iterable[str] | None = None,
    ) -> None:
        self.manager = pluggy.PluginManager("jaxstruct")
        self.manager.add_hookspecs(hookspecs)
        self.manager.register(_Builtins(), name=_BUILTIN_PLUGIN)
        self._entry_points = entry_points or (
            lambda: importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        )
        self._autoload = autoload
        self._block = None if block is None else frozenset(map(_normal, block))
        self._allow = None if allow is None else frozenset(map(_normal, allow))
        self._lock = threading.RLock()
        self._tables: Tables | None = None
        self._built = False  # _tables is complete (a fork mid-build leaves it half made)
        self._runtime: list[tuple[Format | Codec, Origin]] = []
        _REGISTRIES.add(self)

    def _reset_in_child(self) -> None:
        # A forked child inherits the lock as the parent's threads held it: a fresh one,
        # and the tables rebuilt unless the parent had finished building them.
        self._lock = threading.RLock()
        if not self._built:
            self._tables = None

    @property
    def autoload(self) -> bool:
        """Whether entry-point plugins are loaded by this registry."""
        return autoload_enabled() if self._autoload is None else self._autoload

    # -- collecting ----------------------------------------------------------------

    def _ensure(self) -> Tables:
        tables = self._tables
        if tables is not None:
            return tables
        with self._lock:
            if self._tables is None:
                self._built = False
                self._tables = self._build()
                self._built = True
                for message in self._tables.messages:
                    warnings.warn(message, PluginWarning, stacklevel=3)
            return self._tables

    def reload(self) -> None:
        """Collect every plugin again (after one was installed, fixed or unblocked).

        Codecs and formats registered with :func:`register_codec` and
        :func:`register_format` are kept.
        """
        with self._lock:
            for name, _ in self.manager.list_name_plugin():
                if name and name.startswith("entrypoint:"):
                    self.manager.unregister(name=name)
            self._tables = None
        self._ensure()

    def _build(self) -> Tables:
        tables = Tables()
        origin = Origin(_BUILTIN_PLUGIN, "jaxstruct-io (built-in)", "builtin")
        items = self._items(self.manager.get_plugin(_BUILTIN_PLUGIN))  # the built-ins never fail
        for item in items:
            tables.merge(item, origin)
        tables.plugins.append(
            plugin_info(_BUILTIN_PLUGIN, "jaxstruct-io", _own_version(), "loaded", items)
        )
        if self.autoload:
            self._load_entry_points(tables)
        for item, origin in self._runtime:
            tables.messages += tables.merge(item, origin)
        tables.finish()
        tables.refresh()
        return tables

    def _listed(self, ep_name: str, dist: str) -> str | None:
        """Why an entry point is not loaded by the block or allow list, or ``None``."""
        names = {_normal(ep_name), _normal(dist)}
        block = self._block if self._block is not None else _names_from_env(BLOCK_ENV)
        allow = self._allow if self._allow is not None else _names_from_env(ALLOW_ENV)
        if block and names & block:
            return f"blocked ({BLOCK_ENV} or block=)" if self._block is None else "blocked"
        if allow is not None and not names & allow:
            return f"not in the allow list ({ALLOW_ENV} or allow=)"
        return None

    def _load_entry_points(self, tables: Tables) -> None:
        try:
            entry_points = list(self._entry_points())
        except Exception as err:
            tables.messages.append(
                f"listing the {ENTRY_POINT_GROUP!r} entry points failed "
                f"({type(err).__name__}: {err}); no plugin was loaded"
            )
            return
        for ep in entry_points:
            dist, version = _dist_of(ep)
            origin = Origin(str(ep.name), dist, "entrypoint")
            disabled = self._listed(ep.name, dist)
            if disabled is not None:
                tables.plugins.append(
                    plugin_info(ep.name, dist, version, "disabled", reason=disabled)
                )
                continue
            try:
                items = self._load_one(ep)
            except _Refused as refused:
                reason = str(refused)
                message = f"{origin} failed and is not used: {reason}"
                tables.messages.append(message)
                tables.plugins.append(plugin_info(ep.name, dist, version, "failed", reason=reason))
                for key in refused.claimed:
                    if key not in tables.owners and key not in tables.broken:
                        tables.broken[key] = message
                continue
            problems = [problem for item in items for problem in tables.merge(item, origin)]
            tables.messages += problems
            tables.plugins.append(
                plugin_info(ep.name, dist, version, "loaded", items, problems=problems)
            )

    def _load_one(self, ep: Any) -> list[Format | Codec]:
        """Import and register one entry point; its formats and codecs, or :class:`_Refused`."""
        try:
            plugin = ep.load()
        except Exception as err:
            raise _Refused(f"importing it failed ({type(err).__name__}: {err})") from None
        try:
            declared = getattr(plugin, API_ATTRIBUTE, None)
        except Exception as err:  # a module __getattr__ that raises ImportError, say
            raise _Refused(
                f"reading its {API_ATTRIBUTE} raised {type(err).__name__}: {err}; a plugin "
                "module's __getattr__ must raise AttributeError for names it does not have"
            ) from None
        if declared is not None and (
            type(declared) is not int or not 1 <= declared <= PLUGIN_API_VERSION
        ):
            raise _Refused(
                f"it declares {API_ATTRIBUTE} = {declared!r}, and this jaxstruct-io provides "
                f"plugin interface version {PLUGIN_API_VERSION}; upgrade jaxstruct-io"
            )
        name = f"entrypoint:{ep.name}"
        if self.manager.has_plugin(name) or self.manager.is_registered(plugin):
            raise _Refused(
                f"it is registered twice (another entry point named {ep.name!r}, or the same "
                "object under another name); each entry point name must be unique"
            )
        problem = check_hooks(plugin)
        if problem is not None:
            raise _Refused(problem)
        try:
            self.manager.register(plugin, name=name)
        except pluggy.PluginValidationError as err:
            raise _Refused(
                f"a hook implementation does not fit its hook specification ({err}); its "
                "arguments must be named as in jaxstruct.io.hookspecs (or taken away)"
            ) from None
        try:
            return self._items(plugin)
        except _Refused:
            self.manager.unregister(name=name)
            raise

    def _items(self, plugin: Any) -> list[Format | Codec]:
        """Call a registered plugin's hooks; its formats, then codecs, or :class:`_Refused`."""
        found: list[Format | Codec] = []
        for hook, kind in (
            (self.manager.hook.jaxstruct_register_formats, "format"),
            (self.manager.hook.jaxstruct_register_codecs, "codec"),
        ):
            for impl in hook.get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                try:
                    items = list(cast("Iterable[Any]", impl.function() or ()))
                except Exception as err:
                    raise _Refused(f"its {kind} hook raised {type(err).__name__}: {err}") from None
                for item in items:
                    problem = check_item(item, kind)
                    if problem is not None:
                        claimed = [k for it in items for k in claimed_by_broken(it, kind)]
                        raise _Refused(problem, claimed)
                found += items
        return found

    def _register_single(self, item: Format | Codec, what: str) -> None:
        kind = "format" if isinstance(item, Format) else "codec"
        problem = check_item(item, kind)
        if problem is not None:
            raise PluginError(f"{what}() refused {item!r}: {problem.replace('its ', 'the ', 1)}")
        tables = self._ensure()
        with self._lock:
            caller = sys._getframe(2).f_globals.get("__name__", "?")
            origin = Origin(f"{what}()", f"{_RUNTIME}{what}() called from {caller}", "runtime")
            claims = claims_of(item)
            # The same register_*() caller running again (a re-run notebook cell)
            # replaces its earlier registration, once nothing else clashes.
            previous = tables.owners.get(claims[0])
            replaced = previous[0] if previous is not None and previous[1] == origin else None
            for key in claims:
                if key in tables.broken:
                    raise PluginError(f"{key_text(key)} cannot be registered: {tables.broken[key]}")
                other = tables.owners.get(key)
                if other is not None and other[0] is not replaced:
                    raise PluginError(
                        f"{key_text(key)} is registered by both {other[1]} and {origin}; "
                        "choose another name (or type)"
                        if key[0] != "type"
                        else f"{kind} {item.name!r} from {origin} and {kind} "
                        f"{other[0].name!r} from {other[1]} both handle {key[1].__qualname__}"
                    )
            if replaced is not None:
                tables.drop(replaced)
                self._runtime = [(i, o) for i, o in self._runtime if i is not replaced]
            for key in claims:
                tables.owners[key] = (item, origin)
            self._runtime.append((item, origin))
            tables.refresh()

    # -- queries -----------------------------------------------------------------

    @property
    def formats(self) -> dict[str, Format]:
        """Every usable registered format by name (conflicted and failed ones left out)."""
        return dict(self._ensure().views["format"])

    @property
    def codecs(self) -> dict[str, Codec]:
        """Every usable registered codec by name (conflicted and failed ones left out)."""
        return dict(self._ensure().views["codec"])

    @property
    def suffixes(self) -> dict[str, Format]:
        """The format each claimed suffix selects on export (lower case, with the dot)."""
        return dict(self._ensure().views["suffix"])

    def plugins(self) -> list[PluginInfo]:
        """Every plugin: built-in, installed (loaded, failed or disabled) and runtime ones."""
        runtime = [plugin_info(o.plugin, o.dist, "", "loaded", [i]) for i, o in self._runtime]
        return [*self._ensure().plugins, *runtime]

    def source_of(self, kind: str, name: str) -> str:
        """Return the distribution (or description) that registered a format or codec."""
        return self._ensure().owners[(kind, name)][1].dist

    def is_own(self, fmt: Format) -> bool:
        """Whether ``fmt`` is one of jaxstruct-io's own formats (its built-in plugin's):
        tested with this library, they check what they write themselves, so export
        spends no system call on checking it again."""
        entry = self._ensure().owners.get(("format", fmt.name))
        return entry is not None and entry[0] is fmt and entry[1].kind == "builtin"

    def describe_source(self, kind: str, name: str) -> str:
        """Who registered a format or codec, for messages (``plugin 'x' from distribution 'y'``)."""
        return str(self._ensure().owners[(kind, name)][1])

    def _lookup(self, key: Key) -> Any:
        tables = self._ensure()
        message = tables.broken.get(key)
        if message is not None:
            raise PluginError(message)
        entry = tables.owners.get(key)
        return None if entry is None else entry[0]

    def format_named(self, name: str) -> Format | None:
        """Return the format registered under ``name``, or ``None``.

        Raises:
            PluginError: the name belongs to a plugin that failed, or to two plugins.
        """
        return self._lookup(("format", name))

    def format_for_suffix(self, suffix: str) -> Format | None:
        """Return the format that claims ``suffix`` (``".h5"``), or ``None``.

        Raises:
            PluginError: the suffix belongs to a plugin that failed, or to two formats.
        """
        return self._lookup(("suffix", suffix.lower()))

    def codec_for_type(self, cls: type) -> Codec | None:
        """Return the codec handling exactly ``cls``, or ``None``.

        Raises:
            PluginError: two plugins' codecs handle ``cls``.
        """
        tables = self._ensure()
        codec = tables.views["type"].get(cls)
        if codec is not None:
            return codec
        return self._lookup(("type", cls)) if tables.broken else None

    def codec_named(self, name: str) -> Codec | None:
        """Return the codec registered under ``name``, or ``None``.

        Raises:
            PluginError: the name belongs to a plugin that failed, or to two plugins.
        """
        return self._lookup(("codec", name))

    def missing_hint(self) -> str:
        """Words for an error about a name nobody registered: failed plugins, autoload off."""
        tables = self._ensure()
        failed = [p for p in tables.plugins if p.state == "failed"]
        parts = []
        if failed:
            listed = "; ".join(
                f"plugin {p.name!r} from {p.distribution!r} ({p.reason})" for p in failed[:3]
            )
            parts.append(f"a plugin that failed to load may provide it: {listed}")
        if not self.autoload:
            why = f"{AUTOLOAD_ENV} is set" if self._autoload is None else "autoload=False"
            parts.append(f"plugin autoloading is switched off ({why})")
        disabled = [p for p in tables.plugins if p.state == "disabled"]
        if disabled and self.autoload:
            names = ", ".join(repr(p.name) for p in disabled[:5])
            parts.append(f"disabled plugins that may provide it: {names}")
        return "; ".join(parts)


_registry: PluginRegistry | None = None
_registry_lock = threading.Lock()
_REGISTRIES: weakref.WeakSet[PluginRegistry] = weakref.WeakSet()


@_process.at_fork
def _reset_in_child() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()
    for registry in list(_REGISTRIES):
        registry._reset_in_child()  # pyright: ignore[reportPrivateUsage]


def current_registry() -> PluginRegistry:
    """Return the process-wide registry, creating it on first use.

    Its :attr:`~PluginRegistry.formats`, :attr:`~PluginRegistry.codecs` and
    :meth:`~PluginRegistry.plugins` list what this process can use.

    Example:
        >>> {"directory", "zip"} <= set(current_registry().formats)
        True
    """
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

    Installed plugins are collected first, so the outcome does not depend on
    whether an export or load ran before.

    Raises:
        PluginError: the name or one of the types is already taken by another
            plugin or module, or a type is one the manifest stores natively
            (``str``, ``int``, ``dict``, ``numpy.ndarray``, ...: the codec would
            never run).

    Example:
        >>> class Celsius(float): ...
        >>> _ = register_codec(Codec("doctest.celsius", (Celsius,), encode=float, decode=Celsius))
        >>> from jaxstruct.io import from_state_dict, to_state_dict
        >>> from_state_dict(to_state_dict(Celsius(21.5)))
        21.5
    """
    if not isinstance(codec, Codec):
        raise TypeError(f"register_codec() expected a Codec, got {codec!r}")
    current_registry()._register_single(codec, "register_codec")
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
    current_registry()._register_single(fmt, "register_format")
    return fmt
