"""The tables of one collection of plugins: who registered which name, and the clashes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ._formats import Format
from ._values import Codec

#: A name an item takes: ``("format" | "codec" | "suffix" | "type", name, suffix or class)``.
Key = tuple[str, Any]

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
        #: Clashes the built-in or registered item won, by name: said (once) where the
        #: name is used, never to a process that does not use it.
        self.notes: dict[Key, str] = {}
        #: Installed plugins whose names are not known (blocked, disabled, or failed
        #: before their hooks ran): a suffix no format claims may be one of theirs.
        self.unknown: list[PluginInfo] = []

    def copy(self) -> Tables:
        """A copy whose tables can change without changing these."""
        other = Tables()
        other.owners = dict(self.owners)
        other.broken = dict(self.broken)
        other.plugins = list(self.plugins)
        other.notes = dict(self.notes)
        other.unknown = list(self.unknown)
        other.refresh()
        return other

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
            else:
                self.notes.setdefault(name_key, message)
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
            else:
                self.notes.setdefault(key, message)
        return problems


def clash(key: Key, first: Origin, second: Origin) -> str:
    fix = (
        f"uninstall one of them, or block one with {BLOCK_ENV}=<its distribution name>"
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
