"""Reference classes showing where the construction time of a frozen class goes.

They hold the flat model's six fields (``a b c d step tag``) and differ only
in how ``__init__`` stores them:

- ``Plain``: an ordinary mutable class, ``self.a = a``. CPython 3.11
  specialises these stores to a few nanoseconds each, so this is the cost of
  the call itself (keyword binding, frame, instance allocation): the floor of
  any class constructed through a Python ``__init__``.
- ``Frozen``: a ``__setattr__`` that raises makes the class immutable; that
  override also disables the specialised stores, so ``__init__`` writes each
  field with ``object.__setattr__`` (held in a local). This is the cost every
  frozen, ``__dict__``-backed class pays, ``dataclass(frozen=True)`` included.

- ``DictFill``: the same override, but ``__init__`` writes the fields into
  ``self.__dict__``. What ``Struct`` does on CPython 3.13 and later, where the
  dict is built on top of the inline attributes; on 3.11 and 3.12 it moves
  them out of line and slows every later read, so there it is shown only to
  say why ``Struct`` does not do it.

The gap between ``Plain`` and the others is the price of immutability on this
interpreter; see ``benchmarks/README.md`` for the measured numbers.

``PlainLink``, ``FrozenLink`` and ``DictFillLink`` store the same ways the
chain model's three fields (``x child depth``): built into a chain, they show
how each way of storing fares on a small class against the flat one, which is
what the chain / flat construction target compares.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DictFill", "DictFillLink", "Frozen", "FrozenLink", "Plain", "PlainLink"]

_osa = object.__setattr__


class Plain:
    """Mutable: plain attribute stores."""

    def __init__(self, a: Any, b: Any, c: Any, d: Any, step: int, tag: str) -> None:  # noqa: PLR0917 - a dataclass-like signature
        self.a = a
        self.b = b
        self.c = c
        self.d = d
        self.step = step
        self.tag = tag


class Frozen:
    """Immutable: every store goes through ``object.__setattr__``."""

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __init__(self, a: Any, b: Any, c: Any, d: Any, step: int, tag: str) -> None:  # noqa: PLR0917 - a dataclass-like signature
        osa = _osa
        osa(self, "a", a)
        osa(self, "b", b)
        osa(self, "c", c)
        osa(self, "d", d)
        osa(self, "step", step)
        osa(self, "tag", tag)


class DictFill:
    """Immutable, but ``__init__`` fills the instance ``__dict__`` directly."""

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __init__(self, a: Any, b: Any, c: Any, d: Any, step: int, tag: str) -> None:  # noqa: PLR0917 - a dataclass-like signature
        fields = self.__dict__
        fields["a"] = a
        fields["b"] = b
        fields["c"] = c
        fields["d"] = d
        fields["step"] = step
        fields["tag"] = tag


class PlainLink:
    """A chain link of ``Plain``'s kind."""

    def __init__(self, x: Any, child: Any, depth: int) -> None:
        self.x = x
        self.child = child
        self.depth = depth


class FrozenLink:
    """A chain link of ``Frozen``'s kind."""

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __init__(self, x: Any, child: Any, depth: int) -> None:
        osa = _osa
        osa(self, "x", x)
        osa(self, "child", child)
        osa(self, "depth", depth)


class DictFillLink:
    """A chain link of ``DictFill``'s kind."""

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __init__(self, x: Any, child: Any, depth: int) -> None:
        fields = self.__dict__
        fields["x"] = x
        fields["child"] = child
        fields["depth"] = depth
