"""The plugin registry: plugins collected with pluggy, once per process, and what each provides.

A registry can also be used with more items for a while (:meth:`PluginRegistry.using`):
within the ``with`` block, and only in the thread or task that entered it,
:func:`current_registry` is the registry with those items.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import os
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import pluggy
from jaxstruct.registry import SerializationError, StructError

from . import _process, hookspecs
from ._builtin import DirectoryFormat, ZipFormat
from ._formats import Format
from ._plugin_checks import check_hooks, check_item, claimed_by_broken
from ._tables import BLOCK_ENV, Key, Origin, PluginInfo, Tables, claims_of, key_text, plugin_info
from ._values import Codec

__all__ = [
    "ALLOW_ENV",
    "AUTOLOAD_ENV",
    "BLOCK_ENV",
    "ENTRY_POINT_GROUP",
    "PLUGIN_API_VERSION",
    "PluginError",
    "PluginInfo",
    "PluginRegistry",
    "PluginWarning",
    "current_registry",
    "hookimpl",
    "register_codec",
    "register_format",
    "using",
]


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


def user_stacklevel(skip: int = 1) -> int:
    """The ``stacklevel`` that makes a warning point at the first caller outside jaxstruct
    (the user's ``export`` or ``load`` line), counted from the frame ``skip`` levels up."""
    frame = sys._getframe(skip + 1)
    level = skip + 1
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(_OWN):
        frame = frame.f_back
        level += 1
    return level


#: Modules whose frames a warning skips: jaxstruct's own (a plugin's module is the user's).
_OWN = ("jaxstruct.", "pluggy.", "contextlib")


def _warn(message: str) -> None:
    warnings.warn(message, PluginWarning, stacklevel=user_stacklevel(2))


def _caller() -> str:
    """The module name of the first caller outside jaxstruct.io, for messages (a user's
    module, or ``jaxstruct.testing._format_tests`` for the kit's tests)."""
    frame = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(_IO):
        frame = frame.f_back
    return "?" if frame is None else str(frame.f_globals.get("__name__", "?"))


_IO = ("jaxstruct.io.", "contextlib")


class _Refused(PluginError):
    """Why a plugin is not used (the message), and the names it would have claimed."""

    def __init__(self, reason: str, claimed: list[Key] | None = None) -> None:
        super().__init__(reason)
        self.claimed = claimed or []


def _shared_name(name: str, others: list[str]) -> str:
    listed = ", ".join(repr(d) for d in others)
    return (
        f"its entry-point name {name!r} is also advertised by distribution {listed}; an "
        "entry-point name must be unique among all installed distributions (which one would "
        "load depends on the order they were installed in, so neither does): uninstall one, "
        f"rename one's entry point, or block one by its distribution name ({BLOCK_ENV}=<name>)"
    )


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
        #: Counts every change of the tables (a registration, a reload), so that a
        #: registry used with more items (:meth:`using`) sees them.
        self._version = 0
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
                self._version += 1
                for message in self._tables.messages:
                    _warn(message)
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
        else:
            self._list_entry_points(tables)
        for item, origin in self._runtime:
            tables.merge(item, origin)
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

    def _listed_entry_points(self, tables: Tables) -> list[Any] | None:
        """The installed entry points (``None``, with a message, when listing them failed)."""
        try:
            return list(self._entry_points())
        except Exception as err:
            tables.messages.append(
                f"listing the {ENTRY_POINT_GROUP!r} entry points failed "
                f"({type(err).__name__}: {err}); no plugin was loaded"
            )
            return None

    def _list_entry_points(self, tables: Tables) -> None:
        """With autoloading off: every installed plugin is listed as disabled, unimported."""
        why = f"{AUTOLOAD_ENV} is set" if self._autoload is None else "autoload=False"
        for ep in self._listed_entry_points(tables) or ():
            dist, version = _dist_of(ep)
            reason = f"plugin autoloading is switched off ({why})"
            tables.plugins.append(plugin_info(ep.name, dist, version, "disabled", reason=reason))
            tables.unknown.append(tables.plugins[-1])

    def _load_entry_points(self, tables: Tables) -> None:
        entry_points = self._listed_entry_points(tables)
        if entry_points is None:
            return
        listed = [(ep, *_dist_of(ep)) for ep in entry_points]
        # An entry-point name advertised by two distributions: which one loaded would
        # depend on the order of installation, so neither does (both are named).
        dists_of: dict[str, set[str]] = {}
        for ep, dist, _ in listed:
            if self._listed(ep.name, dist) is None:
                dists_of.setdefault(_normal(str(ep.name)), set()).add(dist)
        for ep, dist, version in listed:
            origin = Origin(str(ep.name), dist, "entrypoint")
            disabled = self._listed(ep.name, dist)
            if disabled is not None:
                tables.plugins.append(
                    plugin_info(ep.name, dist, version, "disabled", reason=disabled)
                )
                tables.unknown.append(tables.plugins[-1])
                continue
            others = sorted(d for d in dists_of[_normal(str(ep.name))] if d != dist)
            try:
                if others:
                    raise _Refused(_shared_name(str(ep.name), others))
                items = self._load_one(ep)
            except _Refused as refused:
                reason = str(refused)
                message = f"{origin} failed and is not used: {reason}"
                tables.messages.append(message)
                tables.plugins.append(plugin_info(ep.name, dist, version, "failed", reason=reason))
                tables.unknown.append(tables.plugins[-1])
                for key in refused.claimed:
                    if key not in tables.owners and key not in tables.broken:
                        tables.broken[key] = message
                continue
            problems = [problem for item in items for problem in tables.merge(item, origin)]
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
                f"it is registered twice (another entry point of its distribution named "
                f"{ep.name!r}, or the same object under another entry-point name); each entry "
                "point must name a module of its own, under a name unique among all installed "
                "distributions"
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
            origin = Origin(f"{what}()", f"{_RUNTIME}{what}() called from {_caller()}", "runtime")
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
            self._version += 1

    def using(self, *items: Format | Codec) -> contextlib.AbstractContextManager[PluginRegistry]:
        """Use this registry, with ``items`` (formats and codecs) added, for a ``with`` block.

        Within the block, :func:`current_registry` (and so ``export``, ``load``,
        ``inspect`` and the state dicts) sees this registry with the items, as if
        a plugin provided them; an item named like a registered one (an installed
        plugin's ``tar``) replaces it, and takes its suffixes or types. Nothing
        is installed process-wide: other threads, and this one after the block,
        see the registry as it was. A thread or task started inside the block
        sees it when it copies the context (``contextvars.copy_context()``);
        ``export(..., blocking=False)`` does.

        It is how a plugin's own tests use its format or codec without installing
        it (``jaxstruct.testing.FormatTests`` does), and how a test makes a
        registry of its own (``PluginRegistry(entry_points=...)``) the current one.

        Raises:
            PluginError: an item is not a valid format or codec (as a plugin's would
                be refused), or two of the items claim one name, suffix or type.

        Example:
            >>> import fractions
            >>> import jaxstruct.io as jio
            >>> half = jio.Codec("doctest.half", (fractions.Fraction,), str, fractions.Fraction)
            >>> with jio.current_registry().using(half):
            ...     jio.from_state_dict(jio.to_state_dict(fractions.Fraction(1, 2)))
            Fraction(1, 2)
            >>> "doctest.half" in jio.current_registry().codecs  # outside the block: not there
            False
        """
        scoped = _Scoped(self, items, _caller())
        return _entered(scoped)

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
        """Every plugin: built-in, installed (loaded, failed or disabled) and runtime ones.

        With autoloading switched off, the installed plugins are listed as
        ``disabled`` (and not imported).
        """
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
        if tables.notes:
            self._say(tables, key)
        entry = tables.owners.get(key)
        return None if entry is None else entry[0]

    def _say(self, tables: Tables, key: Key) -> None:
        """Warn (once) about a clash the built-in or registered item won, where it is used."""
        with self._lock:
            message = tables.notes.pop(key, None)
        if message is not None:
            _warn(message)

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
            if tables.notes:
                self._say(tables, ("type", cls))
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
        clashing = [p for p in tables.plugins if p.problems]
        if clashing:
            listed = "; ".join(p.problems[0] for p in clashing[:3])
            parts.append(f"plugins whose names clash are not used for those names: {listed}")
        return "; ".join(parts)

    def check_suffix(self, path: str, suffix: str) -> None:
        """Refuse to export ``path`` as a directory when no loaded format claims its
        ``suffix`` (``".uxc"``) but an installed plugin that is not loaded (blocked,
        disabled, or failed) may claim it: its names are not known without importing it.

        Raises:
            SerializationError: naming those plugins and their distributions, and the
                ways out (nothing is written).

        Example:
            >>> PluginRegistry(entry_points=list).check_suffix("run.uxc", ".uxc")  # none: fine
        """
        unknown = self._ensure().unknown
        if not unknown or self.format_for_suffix(suffix) is not None:
            return
        listed = "; ".join(
            f"plugin {p.name!r} from distribution {p.distribution!r} ({p.state}: {p.reason})"
            for p in unknown[:3]
        )
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise SerializationError(
            f"{path!r}: no loaded format claims the suffix {suffix!r}, and installed plugins "
            f"that are not loaded may: {listed}{more}; nothing was written. Load the plugin "
            "that provides this format (unblock or fix it; `jaxstruct plugins` lists them), "
            'or pass format="directory" to write a directory checkpoint under this name'
        )


@contextlib.contextmanager
def _entered(scoped: PluginRegistry) -> Iterator[PluginRegistry]:
    token = _SCOPE.set(scoped)
    try:
        yield scoped
    finally:
        _SCOPE.reset(token)


class _Scoped(PluginRegistry):
    """A registry used with more items for a ``with`` block (:meth:`PluginRegistry.using`).

    It has no plugin manager of its own: its tables are its base's, with its items
    put over them, made again whenever the base's change.
    """

    def __init__(self, base: PluginRegistry, items: Iterable[Format | Codec], caller: str) -> None:
        self.base = base
        self.manager = base.manager
        self._autoload = base._autoload  # pyright: ignore[reportPrivateUsage]
        self._lock = threading.RLock()
        self._tables = None
        self._built = False
        self._runtime = []
        self._version = 0
        self._seen: tuple[int, int] | None = None
        _REGISTRIES.add(self)
        dist = f"jaxstruct.io using() in {caller}"
        self._origin = Origin("using()", dist, "scoped")
        self._items_used = list(items)
        owners: dict[Key, Any] = {}
        for item in self._items_used:
            kind = "format" if isinstance(item, Format) else "codec"
            problem = check_item(item, kind)
            if problem is not None:
                raise PluginError(f"using() refused {item!r}: {problem.replace('its ', 'the ', 1)}")
            for key in claims_of(item):
                if key in owners:
                    raise PluginError(
                        f"using() was given two items that claim the {key_text(key)}: "
                        f"{owners[key]!r} and {item!r}; pass one of them"
                    )
                owners[key] = item
        self._ensure()  # a clash with the base's tables shows now, not at first use

    @property
    def autoload(self) -> bool:
        return self.base.autoload

    def _ensure(self) -> Tables:
        base = self.base._ensure()  # pyright: ignore[reportPrivateUsage]
        seen = (id(base), self.base._version)  # pyright: ignore[reportPrivateUsage]
        tables = self._tables
        if tables is not None and self._seen == seen:
            return tables
        with self._lock:
            tables = base.copy()
            tables.plugins = self.base.plugins()
            tables.plugins.append(
                plugin_info("using()", self._origin.dist, "", "loaded", self._items_used)
            )
            for item in self._items_used:
                claims = claims_of(item)
                shadowed = tables.owners.get(claims[0])
                if shadowed is not None:
                    tables.drop(shadowed[0])
                for key in claims:
                    tables.broken.pop(key, None)
                    tables.notes.pop(key, None)
                    tables.owners[key] = (item, self._origin)
            tables.refresh()
            self._tables, self._seen = tables, seen
            self._built = True
            return tables

    def reload(self) -> None:
        self.base.reload()

    def plugins(self) -> list[PluginInfo]:
        return list(self._ensure().plugins)

    def _register_single(self, item: Format | Codec, what: str) -> None:
        # register_codec() inside the block registers in the process, as outside it.
        self.base._register_single(item, what)  # pyright: ignore[reportPrivateUsage]

    def _reset_in_child(self) -> None:
        self._lock = threading.RLock()


#: The registry of the innermost ``using()`` block of this thread or task, if any.
_SCOPE: contextvars.ContextVar[PluginRegistry | None] = contextvars.ContextVar(
    "jaxstruct_io_registry", default=None
)


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
    """Return the registry in use: the process-wide one, created on first use (or, inside
    a ``with`` block of :meth:`PluginRegistry.using`, that block's).

    Its :attr:`~PluginRegistry.formats`, :attr:`~PluginRegistry.codecs` and
    :meth:`~PluginRegistry.plugins` list what this process can use.

    Example:
        >>> {"directory", "zip"} <= set(current_registry().formats)
        True
    """
    scoped = _SCOPE.get()
    if scoped is not None:
        return scoped
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


def using(*items: Format | Codec) -> contextlib.AbstractContextManager[PluginRegistry]:
    """Use ``items`` (formats and codecs that are not installed) for a ``with`` block:
    ``current_registry().using(*items)``; see :meth:`PluginRegistry.using`.

    Raises:
        PluginError: an item is not a valid format or codec, or two items clash.

    Example:
        >>> import ipaddress
        >>> import jaxstruct.io as jio
        >>> ipv4 = jio.Codec("doctest.ipv4", (ipaddress.IPv4Address,), str, ipaddress.IPv4Address)
        >>> with jio.using(ipv4):
        ...     jio.from_state_dict(jio.to_state_dict(ipaddress.IPv4Address("10.0.0.1")))
        IPv4Address('10.0.0.1')
    """
    return current_registry().using(*items)


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
