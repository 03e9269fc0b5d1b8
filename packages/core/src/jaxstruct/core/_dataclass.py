"""The stdlib dataclass protocol on struct classes, built on first use.

``dataclasses.is_dataclass``, ``fields``, ``replace``, ``asdict`` and
``astuple`` (and the tools built on them: jaxtyping's ``@jaxtyped``,
treescope, pytest's assertion diffs) look for ``__dataclass_fields__`` and
``__dataclass_params__`` on the class. Both are class-level descriptors on
``Struct``: nothing is built when a class is defined (class definition is a
benchmark target), and the ``dataclasses.Field`` objects of a class are made
once, the first time a tool asks, from a throwaway stdlib dataclass with the
same fields (so they are genuine ``Field`` objects, whatever the Python
version expects of them). That table then replaces the descriptor in the
class's own ``__dict__``: ``dataclasses.replace`` and ``fields`` read it twice
per call, and a plain dict costs them nothing (a descriptor call made a
user's ``dataclasses.replace`` 1.2x flax.struct's). Each struct class gets the
descriptor in its own ``__dict__`` when it is created, so a subclass never
sees its parent's table.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ._fields import MISSING, FieldSpec
from ._layout import Layout

__all__ = ["FIELDS_DESCRIPTOR", "DataclassFields", "DataclassParams", "StructParams"]


class StructParams:
    """What ``__dataclass_params__`` reports for a struct class (read-only)."""

    __slots__ = ("match_args",)

    init = True
    repr = True
    eq = True
    order = False
    unsafe_hash = False
    frozen = True
    kw_only = False
    slots = False
    weakref_slot = False

    def __init__(self, match_args: bool) -> None:
        self.match_args = match_args

    def __repr__(self) -> str:
        return f"StructParams(frozen=True, eq=True, match_args={self.match_args})"


def _field_type(spec: FieldSpec) -> Any:
    hint = spec.type
    if spec.initvar and not isinstance(hint, dataclasses.InitVar):
        # A string annotation ("InitVar[bool]"): dataclasses needs the object.
        return dataclasses.InitVar(hint)  # type: ignore[arg-type]
    return hint if not isinstance(hint, str) else Any


def build_fields(layout: Layout) -> dict[str, Any]:
    """Make (once) and return the ``dataclasses.Field`` objects of ``layout``'s class."""
    if layout.dataclass_fields is not None:
        return layout.dataclass_fields
    specs = layout.members
    declared = [
        (
            spec.name,
            _field_type(spec),
            dataclasses.field(
                init=spec.init and spec.derived is None,
                repr=spec.repr,
                compare=spec.compare,
                metadata=dict(spec.metadata) or None,
                kw_only=spec.kw_only,
            ),
        )
        for spec in specs
    ]
    # init=False: no __init__ is generated, so neither field order nor
    # defaults are checked here (jaxstruct checked them already, by its rules).
    model = dataclasses.make_dataclass(
        layout.cls.__name__, declared, init=False, repr=False, eq=False
    )
    table: dict[str, Any] = dict(model.__dataclass_fields__)  # type: ignore[attr-defined]
    for spec in specs:
        entry = table[spec.name]
        entry.type = spec.type
        if spec.default is not MISSING:
            entry.default = spec.default
        if spec.default_factory is not MISSING:
            entry.default_factory = spec.default_factory
    layout.dataclass_fields = table
    # From now on the class answers with the table itself (see the module docstring);
    # type.__setattr__, because StructMeta refuses these names to dataclass decorators.
    type.__setattr__(layout.cls, "__dataclass_fields__", table)
    return table


def _layout_of(obj: Any, owner: Any, name: str) -> Layout:
    cls = owner if owner is not None else type(obj)
    layout = cls.__dict__.get("__struct_layout__")
    if layout is None:
        # The Struct base class itself declares no fields: not a dataclass.
        raise AttributeError(name)
    return layout


class DataclassFields:
    """Class attribute ``__dataclass_fields__`` of every struct class (lazily built)."""

    __slots__ = ()

    def __get__(self, obj: Any, owner: Any = None) -> dict[str, Any]:
        layout = _layout_of(obj, owner, "__dataclass_fields__")
        return layout.dataclass_fields or build_fields(layout)


#: The descriptor every struct class holds in its own ``__dict__`` until its table is built.
FIELDS_DESCRIPTOR = DataclassFields()


class DataclassParams:
    """Class attribute ``__dataclass_params__`` of every struct class."""

    __slots__ = ()

    def __get__(self, obj: Any, owner: Any = None) -> StructParams:
        layout = _layout_of(obj, owner, "__dataclass_params__")
        return StructParams(bool(getattr(layout.cls, "__match_args__", ())))
