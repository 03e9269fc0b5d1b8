"""IPython and rich integration: IPython shows the :func:`pformat` layout, rich its own.

IPython's display is ``repr``'s (small arrays by value); rich shows every
array as its dtype-and-shape summary, whatever its size.

Neither library is imported here: IPython hands us its printer, rich reads
what ``__rich_repr__`` yields, so importing ``jaxstruct.core`` stays free of
both.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from ._repr import is_namedtuple as _is_namedtuple
from ._repr import pformat, summarize_array

__all__ = ["PrettyHook", "ipython_pretty", "rich_fields"]


def ipython_pretty(obj: Any, p: Any, cycle: bool) -> None:
    """Write ``obj`` to IPython's pretty printer ``p`` in the :func:`pformat` layout."""
    if cycle:
        p.text(f"{type(obj).__name__}(...)")
        return
    # Lines after the first are indented by the printer's own nesting level
    # (``break_`` adds it), so a struct inside an IPython-printed list stays aligned.
    width = max(p.max_width - p.indentation, 20)
    first, *rest = pformat(obj, width=width).split("\n")
    p.text(first)
    for line in rest:
        p.break_()
        p.text(line)


class PrettyHook:
    """The ``_repr_pretty_`` attribute: a method on instances, harmless on the class.

    IPython looks it up on the class and calls ``meth(obj, p, cycle)``; other
    printers (Hypothesis's copy of IPython's, from Hypothesis 6.115.6 on) call
    ``obj._repr_pretty_(p, cycle)`` on whatever they print, struct classes
    included. A plain method would fail the second way, so the class-level
    lookup returns a callable that handles both.
    """

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is not None:
            return functools.partial(ipython_pretty, obj)
        return functools.partial(_pretty_from_class, cls)


def _pretty_from_class(cls: type, *args: Any) -> None:
    if len(args) == 3:  # IPython: cls._repr_pretty_(obj, p, cycle)
        ipython_pretty(*args)
    else:  # a printer printing the class object itself
        args[0].text(repr(cls))


class _Shown:
    """A value rich prints verbatim (``repr`` is the given text)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _for_rich(value: Any, path: set[int]) -> Any:
    summary = summarize_array(value)
    if summary is not None:
        return _Shown(summary)
    kind: Any = type(value)
    # Rebuild only the containers rich itself walks, so arrays inside them
    # are summarised too; structs keep their own __rich_repr__.
    if kind is dict or kind is list or kind is tuple:
        rebuild: Any = kind
    elif issubclass(kind, tuple) and _is_namedtuple(kind):
        rebuild = kind._make  # pyright: ignore[reportAttributeAccessIssue] - a named tuple
    else:
        return value
    if id(value) in path:
        return _Shown({list: "[...]", dict: "{...}"}.get(kind, "(...)"))
    path.add(id(value))
    if kind is dict:
        out = {k: _for_rich(v, path) for k, v in value.items()}
    else:
        out = rebuild(_for_rich(v, path) for v in value)
    path.discard(id(value))
    return out


def rich_fields(obj: Any) -> Iterator[tuple[str, Any]]:
    """Yield ``(name, value)`` for each shown field of a struct, for ``__rich_repr__``."""
    for name in type(obj).__struct_layout__.repr_names:
        yield name, _for_rich(getattr(obj, name), set())
