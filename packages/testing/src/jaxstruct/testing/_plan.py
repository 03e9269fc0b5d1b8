"""The order in which ``structs()`` draws a class's fields, and how they depend on each other.

Checks that tie fields together (an array's shape equals ``(n_chains,
n_sites)``) refused nearly every draw when fields were drawn independently.
Two ways to state the tie, both read here once per ``structs()`` call:

* ``sizes={"chains": "n_chains"}`` binds a jaxtyping named size to an int
  field: the field is drawn first (from the size option, through its
  validators), and every ``chains`` dimension takes its value; a path
  (``{"d": "config.d_model"}``) binds it to an int field of a nested struct,
  whose field is drawn first;
* an override may be a function whose parameters name other fields:
  ``chains=lambda n_chains, n_sites: ...`` returns the strategy for
  ``chains`` given the values drawn for those fields, which are drawn first.

Strategy overrides are drawn early too, so the named sizes their shapes show
bind the other fields (``x=st.just(jnp.zeros((2, 3)))`` makes ``n`` 2).
"""

from __future__ import annotations

import heapq
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import strategies as st
from jaxstruct.core import FieldSpec

__all__ = ["Plan", "bindings_inside", "split_sizes"]


def split_sizes(sizes: Any) -> tuple[Any, dict[str, str]]:
    """Split a ``sizes=`` option into the size option proper and ``{size name: field}``."""
    if not isinstance(sizes, Mapping):
        return sizes, {}
    bindings = {k: v for k, v in sizes.items() if isinstance(v, str)}
    rest = {k: v for k, v in sizes.items() if not isinstance(v, str)}
    return rest, bindings


def bindings_inside(
    bindings: Mapping[str, str], settable: Mapping[str, Any]
) -> dict[str, dict[str, str]]:
    """The size bindings that name a path (``"config.d_model"``), by the field they go through.

    Example:
        >>> bindings_inside({"d": "config.d_model", "n": "n"}, {"config": 0, "n": 0})
        {'config': {'d': 'd_model'}}
    """
    inside: dict[str, dict[str, str]] = {}
    for size, field in bindings.items():
        head, dot, rest = field.partition(".")
        if dot and head in settable:
            inside.setdefault(head, {})[size] = rest
    return inside


def _parameters(cls: type, name: str, fn: Callable[..., Any]) -> tuple[str, ...]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        raise TypeError(
            f"structs({cls.__qualname__}, {name}=...): cannot read the parameters of {fn!r}; "
            "pass a strategy, or a function whose parameters name the fields it depends on"
        ) from None
    names = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(
                f"structs({cls.__qualname__}, {name}=...): a dependent override takes the "
                f"fields it depends on as named parameters, got {p} in {fn!r}"
            )
        if p.default is p.empty:
            names.append(p.name)
    return tuple(names)


class Plan:
    """What ``structs(cls, ...)`` draws, in which order, and what binds which size."""

    __slots__ = (
        "bound",
        "bound_inside",
        "cls",
        "depends",
        "extra",
        "nested",
        "order",
        "overrides",
        "settable",
    )

    def __init__(
        self,
        cls: type,
        settable: dict[str, FieldSpec],
        overrides: Mapping[str, Any],
        bindings: Mapping[str, str],
        *,
        strict: bool = True,
        extra: Any = None,
        nested: tuple[str, ...] = (),
    ) -> None:
        self.cls = cls
        #: Nested struct fields drawn with bindings or overrides inside them (shared sizes).
        self.nested = nested
        self.settable = settable
        self.overrides = dict(overrides)
        where = f"structs({cls.__qualname__})"
        #: field name -> the size name it binds.
        self.bound: dict[str, str] = {}
        #: nested struct field -> {size name: the path inside it} (``"config.d_model"``).
        self.bound_inside = bindings_inside(bindings, settable)
        for size, field in bindings.items():
            if field.partition(".")[0] in self.bound_inside:
                continue
            if field not in settable:
                if not strict:
                    continue
                raise TypeError(
                    f"{where}: sizes={{{size!r}: {field!r}}} binds the size {size!r} to "
                    f"{field!r}, which is not a field the constructor takes; fields are "
                    f"{sorted(settable)}"
                )
            self.bound[field] = size
        #: field name -> the fields its dependent override takes.
        self.depends: dict[str, tuple[str, ...]] = {}
        for name, value in self.overrides.items():
            if isinstance(value, st.SearchStrategy):
                continue
            if not callable(value):
                raise TypeError(
                    f"structs({cls.__qualname__}, {name}=...): expected a strategy, or a "
                    f"function of other fields returning one, got {type(value).__name__} "
                    f"{value!r}; wrap a constant as st.just({value!r})"
                )
            params = _parameters(cls, name, value)
            unknown = [p for p in params if p not in settable or p == name]
            if unknown:
                raise TypeError(
                    f"structs({cls.__qualname__}, {name}=...): the override depends on "
                    f"{', '.join(map(repr, unknown))}, which is not another field the "
                    f"constructor takes; fields are {sorted(settable)}"
                )
            self.depends[name] = params
        self.order = self._order()
        #: What the draw also needs (options, nesting), given by ``structs()``.
        self.extra = extra

    def __repr__(self) -> str:
        # Shown by Hypothesis in "while generating 'x' from ...": say what was asked for.
        names = "".join(f", {name}=..." for name in self.overrides)
        return f"structs({self.cls.__qualname__}{names})"

    def _rank(self, name: str) -> int:
        if name in self.depends:
            return 2
        if name in self.bound_inside or name in self.nested:
            return 0
        if name in self.bound or name in self.overrides:
            return 0 if name in self.bound else 1
        return 2

    def _order(self) -> list[str]:
        """Bound sizes, then strategy overrides, then the rest; dependencies before dependents."""
        index = {name: i for i, name in enumerate(self.settable)}
        waiting = {name: set(self.depends.get(name, ())) for name in self.settable}
        ready = [(self._rank(n), index[n], n) for n, deps in waiting.items() if not deps]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            _, _, name = heapq.heappop(ready)
            order.append(name)
            for other, deps in waiting.items():
                if name in deps:
                    deps.discard(name)
                    if not deps:
                        heapq.heappush(ready, (self._rank(other), index[other], other))
        if len(order) != len(self.settable):
            cycle = sorted(n for n in self.settable if n not in order)
            raise TypeError(
                f"structs({self.cls.__qualname__}): the dependent overrides of "
                f"{', '.join(map(repr, cycle))} depend on each other in a cycle; one of them "
                "must be a plain strategy"
            )
        return order
