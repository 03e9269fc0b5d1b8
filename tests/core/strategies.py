"""Hypothesis strategies generating struct classes and instances of them (tests only).

A class is drawn as a list of field descriptions (kind, default or not); an
instance as values matching each field's kind: node fields hold floats, ints,
NumPy arrays, lists or (for nesting) instances of another generated class;
static fields hold hashable values; opaque fields hold arbitrary objects.
"""

from __future__ import annotations

import copy
import functools
import itertools
from dataclasses import dataclass
from typing import Any

import jaxstruct.core as js
import numpy as np
from hypothesis import strategies as st

_counter = itertools.count()

KINDS = ("node", "static", "opaque")

hashable_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**31), 2**31),
        st.floats(allow_nan=False),
        st.text(max_size=5),
    ),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=4,
)

arrays = st.builds(
    lambda shape, seed: np.random.default_rng(seed).standard_normal(shape).astype(np.float32),
    st.lists(st.integers(0, 3), max_size=2).map(tuple),
    st.integers(0, 2**16),
)

node_leaves = st.one_of(st.floats(allow_nan=False), st.integers(-100, 100), arrays)


@dataclass(frozen=True)
class FieldDesc:
    name: str
    kind: str
    has_default: bool


@dataclass(frozen=True)
class ClassDesc:
    """A generated struct class and what was drawn to build it."""

    cls: type
    fields: tuple[FieldDesc, ...]
    child: ClassDesc | None  # class whose instances nest in the field "nested"


def _make_class(
    fields: tuple[FieldDesc, ...], defaults: dict[str, Any], child: type | None
) -> type:
    annotations: dict[str, Any] = {}
    ns: dict[str, Any] = {}
    for f in fields:
        annotations[f.name] = object
        options: dict[str, Any] = {}
        if f.kind == "static":
            options["static"] = True
        elif f.kind == "opaque":
            options["pytree"] = False
        if f.has_default:
            value = defaults[f.name]
            if type(value).__hash__ is None:
                # Mutable defaults are refused: each instance gets its own copy.
                options["default_factory"] = functools.partial(copy.deepcopy, value)
            else:
                options["default"] = value
        ns[f.name] = js.field(**options)
    if child is not None:
        annotations["nested"] = child
        ns["nested"] = js.field(kw_only=True)
    ns["__annotations__"] = annotations
    ns["__module__"] = __name__
    return type(f"Generated{next(_counter)}", (js.Struct,), ns)


@st.composite
def field_lists(draw: st.DrawFn) -> tuple[FieldDesc, ...]:
    """Draw field descriptions: required fields first, then defaulted ones."""
    kinds = draw(st.lists(st.sampled_from(KINDS), max_size=5))
    n_required = draw(st.integers(0, len(kinds)))
    return tuple(
        FieldDesc(name=f"f{i}", kind=kind, has_default=i >= n_required)
        for i, kind in enumerate(kinds)
    )


def _value_for(kind: str) -> st.SearchStrategy[Any]:
    if kind == "node":
        return node_leaves | st.lists(node_leaves, max_size=2)
    if kind == "static":
        return hashable_values
    return st.builds(object) | st.integers()


@st.composite
def struct_classes(draw: st.DrawFn, *, max_depth: int = 2) -> ClassDesc:
    """Draw a new struct class (possibly with a field nesting another generated class)."""
    child = (
        draw(struct_classes(max_depth=max_depth - 1))
        if max_depth > 1 and draw(st.booleans())
        else None
    )
    fields = draw(field_lists())
    defaults = {f.name: draw(_value_for(f.kind)) for f in fields if f.has_default}
    cls = _make_class(fields, defaults, child.cls if child else None)
    return ClassDesc(cls=cls, fields=fields, child=child)


def instances_of(desc: ClassDesc) -> st.SearchStrategy[Any]:
    """Instances of a generated class, every field given explicitly or by default."""

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        kwargs: dict[str, Any] = {}
        for f in desc.fields:
            if not f.has_default or draw(st.booleans()):
                kwargs[f.name] = draw(_value_for(f.kind))
        if desc.child is not None:
            kwargs["nested"] = draw(instances_of(desc.child))
        return desc.cls(**kwargs)

    return build()


@st.composite
def structs(draw: st.DrawFn) -> Any:
    """An instance of a freshly generated struct class."""
    return draw(instances_of(draw(struct_classes())))


@st.composite
def hashable_structs(draw: st.DrawFn) -> tuple[Any, ClassDesc, dict[str, Any]]:
    """A class whose fields all hold hashable values, with the values used to build it."""
    fields = draw(field_lists())
    cls = _make_class(tuple(FieldDesc(f.name, f.kind, False) for f in fields), {}, None)
    desc = ClassDesc(
        cls=cls, fields=tuple(FieldDesc(f.name, f.kind, False) for f in fields), child=None
    )
    values = {f.name: draw(hashable_values) for f in fields}
    return cls(**values), desc, values
