"""Who provides which name: the table a plugin registry builds, and what it lists."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, NamedTuple

from ._codecs import Codec
from ._formats import Format
from ._plugin_checks import Key

__all__ = ["BLOCK_ENV", "Origin", "PluginInfo", "Tables", "claims_of", "key_text", "plugin_info"]

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
    keys: list[Key]
    if isinstance(item, Format):
        keys = [("format", item.name)]
        keys += [("suffix", s.lower()) for s in item.suffixes]
    else:
        keys = [("codec", item.name)]
        keys += [("type", cls) for cls in item.types]
    return keys


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
        self.formats: dict[str, Format] = {}
        self.codecs: dict[str, Codec] = {}
        self.by_type: dict[type, Codec] = {}
        self.by_suffix: dict[str, Format] = {}

    def refresh(self) -> None:
        """Rebuild the lookup views from ``owners``."""
        views: dict[str, dict[Any, Any]] = {"format": {}, "codec": {}, "type": {}, "suffix": {}}
        for (kind, value), (item, _) in self.owners.items():
            views[kind][value] = item
        self.formats = views["format"]
        self.codecs = views["codec"]
        self.by_type = views["type"]
        self.by_suffix = views["suffix"]

    def _drop(self, item: Any, message: str) -> None:
        """Remove every claim of ``item``, marking each conflicted with ``message``."""
        for key in [k for k, (owner, _) in self.owners.items() if owner is item]:
            del self.owners[key]
            self.broken[key] = message

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
            if other[1].kind == "entrypoint":
                self._drop(other[0], message)
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


def plugin_info(  # noqa: PLR0917 - one call shape for every plugin kind
    name: str,
    dist: str,
    version: str,
    state: str,
    formats: Iterable[Format] = (),
    codecs: Iterable[Codec] = (),
    *,
    reason: str = "",
    problems: Iterable[str] = (),
) -> PluginInfo:
    return PluginInfo(
        name=str(name),
        distribution=dist,
        version=version,
        state=state,
        reason=reason,
        formats=tuple(
            f"{f.name} ({', '.join(f.suffixes)})" if f.suffixes else f.name for f in formats
        ),
        codecs=tuple(c.name for c in codecs),
        problems=tuple(problems),
    )
