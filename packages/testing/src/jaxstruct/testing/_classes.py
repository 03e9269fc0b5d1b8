"""``struct_classes()``: a strategy of struct *classes* (the idea of attrs' tests/strategies.py)."""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable
from typing import Any

import jaxstruct.core as js
import numpy as np
from hypothesis import strategies as st

__all__ = ["GENERATED_MODULE", "struct_classes"]

#: ``__module__`` of generated classes; they resolve through the in-process class registry.
GENERATED_MODULE = "jaxstruct.testing.generated"

_counter = itertools.count()

# (annotation, field kind, strategy of defaults or None): the menu of field types.
_NODE_TYPES: tuple[tuple[Any, st.SearchStrategy[Any] | None], ...] = (
    (np.ndarray, None),
    (object, None),
    (float, st.floats(-10, 10)),
    (int, st.integers(-10, 10)),
    (list[np.ndarray], None),
    (dict[str, float], None),
)
_STATIC_TYPES: tuple[tuple[Any, st.SearchStrategy[Any] | None], ...] = (
    (int, st.integers(-10, 10)),
    (str, st.text("abc", max_size=3)),
    (bool, st.booleans()),
    (tuple[int, ...], st.lists(st.integers(0, 3), max_size=2).map(tuple)),
)


def _nonnegative(value: Any) -> bool:
    return value >= 0


def _name_of(self: Any) -> str:
    return type(self).__name__


@st.composite
def _field(
    draw: Callable[..., Any], nested: st.SearchStrategy[type] | None
) -> tuple[Any, Any, bool]:
    """Draw (annotation, field() spec or MISSING, has_default) for one field."""
    kinds = ["node", "node", "static", "opaque", "checked", "derived"]
    if nested is not None:
        kinds.append("nested")
    kind = draw(st.sampled_from(kinds))
    if kind == "nested" and nested is not None:
        return draw(nested), js.MISSING, False
    if kind == "checked":
        # A converter and a validator: structs() must respect both.
        return int, js.field(converter=abs, validator=_nonnegative), False
    if kind == "derived":
        return str, js.field(static=True, init=False, derived=_name_of), True
    if kind == "opaque":
        # Opaque fields are not serialised, so they always have a default to load back to.
        return object, js.field(pytree=False, default=None), True
    menu = _NODE_TYPES if kind == "node" else _STATIC_TYPES
    annotation, defaults = draw(st.sampled_from(menu))
    static = kind == "static"
    if defaults is not None and draw(st.booleans()):
        return annotation, js.field(static=static, default=draw(defaults)), True
    return annotation, js.field(static=static), False


def _make(fields: list[tuple[Any, Any, bool]], base: type) -> type:
    # Required fields first: a required field may not follow one with a default.
    ordered = sorted(enumerate(fields), key=lambda item: item[1][2])
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {}
    for index, (annotation, spec, _) in ordered:
        name = f"f{index}"
        annotations[name] = annotation
        if spec is not js.MISSING:
            namespace[name] = spec
    number = next(_counter)
    name = f"Generated{number}"

    def body(ns: dict[str, Any]) -> None:
        ns["__module__"] = GENERATED_MODULE
        ns["__qualname__"] = name
        ns["__annotations__"] = annotations
        ns["__jaxstruct_generated__"] = True
        ns.update(namespace)

    return types.new_class(name, (base,), {}, body)


def struct_classes(
    *, max_fields: int = 4, max_depth: int = 2, base: type | None = None
) -> st.SearchStrategy[type]:
    """Return a strategy generating struct classes: node, static, opaque and derived fields,
    defaults, a converter with a validator, and nested struct fields.

    The classes are registered like any struct (so ``jaxstruct.io`` can
    resolve them in this process) under the module ``jaxstruct.testing.generated``.
    Combine with :func:`structs` to draw instances: ``struct_classes().flatmap(structs)``.

    Args:
        max_fields: the most fields one class gets.
        max_depth: how deep struct fields may nest.
        base: the struct base class to derive from (``Struct`` by default).

    Returns:
        A strategy of new struct classes.

    Example:
        >>> from hypothesis import given, settings
        >>> import jaxstruct.core as js
        >>> from jaxstruct.testing import struct_classes
        >>> @settings(max_examples=5)
        ... @given(struct_classes())
        ... def test(cls):
        ...     assert js.is_struct(cls) and len(js.fields(cls)) <= 4
        >>> test()
    """
    root = js.Struct if base is None else base

    def level(depth: int) -> st.SearchStrategy[type]:
        one = _field(level(depth - 1) if depth > 0 else None)
        return st.lists(one, max_size=max_fields).map(lambda fs: _make(fs, root))

    return st.deferred(lambda: level(max_depth))
