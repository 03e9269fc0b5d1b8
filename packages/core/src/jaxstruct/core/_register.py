"""``register_class``/``dataclass``: promote an existing class to a Struct."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from typing_extensions import dataclass_transform

from ._fields import MISSING, FieldSpec, field, from_dataclasses_field
from ._meta import StructMeta, is_initvar
from ._struct import Struct

__all__ = ["dataclass", "register_class"]

T = TypeVar("T", bound=type)

_SKIP = frozenset({"__dict__", "__weakref__", "__annotations__", "__module__", "__qualname__"})


def _metaclass_for(cls: type) -> type:
    meta = type(cls)
    if issubclass(StructMeta, meta):
        return StructMeta
    if issubclass(meta, StructMeta):
        return meta
    # A foreign metaclass: combine it with ours instead of failing with a conflict.
    return type(f"Struct{meta.__name__}", (StructMeta, meta), {})


def _from_stdlib_dataclass(cls: type, ns: dict[str, Any]) -> bool:
    """Take over a stdlib dataclass's fields and InitVars; return whether its own __init__ stays."""
    annotations: dict[str, Any] = {}
    regular = {f.name for f in dataclasses.fields(cls)}
    table: dict[str, dataclasses.Field[Any]] = cls.__dataclass_fields__  # type: ignore[attr-defined]
    for f in table.values():
        if f.name in regular:
            ns[f.name] = from_dataclasses_field(f)
        elif is_initvar(f.type):
            if f.default is not dataclasses.MISSING:
                ns[f.name] = f.default
        else:
            continue  # a ClassVar
        annotations[f.name] = f.type
    ns["__annotations__"] = annotations
    params = getattr(cls, "__dataclass_params__", None)
    own_init = "__init__" in cls.__dict__ and not getattr(params, "init", True)
    if own_init:
        # @dataclass(init=False) with an __init__ of its own: keep it.
        ns["__init__"] = cls.__dict__["__init__"]
    return own_init


@overload
def register_class(cls: T, /) -> T: ...
@overload
def register_class(*, name: str | None = None, kw_only: bool = False) -> Callable[[T], T]: ...
@dataclass_transform(frozen_default=True, field_specifiers=(field, FieldSpec, dataclasses.field))
def register_class(cls: Any = None, /, *, name: str | None = None, kw_only: bool = False) -> Any:
    """Promote an existing class to a :class:`Struct` (decorator or direct call).

    Returns a new class whose bases are ``(cls, Struct)``: the original class
    comes first in the MRO, so its methods and ``super()`` calls keep working.
    Fields come from the class's annotations (``field()`` works as usual); a
    ``__init__`` defined in the class is kept as a user-written constructor.
    A stdlib dataclass keeps its fields, options and InitVar pseudo-fields (and its own
    ``__init__`` when declared with ``init=False``). Field metadata
    ``{"static": True}`` (equinox) or ``{"pytree_node": False}`` (flax, optree)
    makes a field static. A struct class (a subclass of a struct, decorated as
    code written for dataclasses is) is returned as it is: its fields were
    collected when it was defined.

    Args:
        cls: the class to promote.
        name: register (and name) the new class under this name instead.
        kw_only: make the class's own fields keyword-only (as the class keyword does).

    Returns:
        The new struct class.

    Example:
        >>> import jaxstruct.core as js
        >>> @js.register_class
        ... class Params:
        ...     weights: object
        ...     scale: float = js.field(static=True, default=1.0)
        >>> Params(weights=[1.0]).replace(scale=2.0)
        Params(weights=[1.0], scale=2.0)
        >>> issubclass(Params, js.Struct), Params.__mro__[1].__name__
        (True, 'Params')
    """

    def wrap(original: type) -> type:
        if not isinstance(original, type):
            raise TypeError(f"register_class() expected a class, got {original!r}")
        if isinstance(original, StructMeta):
            if name is None and not kw_only:
                # A struct class (a subclass decorated as code written for
                # dataclasses is): its fields were collected when it was defined.
                return original
            raise TypeError(
                f"{original.__qualname__} is already a Struct, so register_class() cannot "
                "rename it or make its fields keyword-only; pass kw_only=True as a class "
                "keyword (class C(Parent, kw_only=True)) or field(kw_only=True)"
            )
        new_name = name or original.__name__
        qualname = original.__qualname__.rpartition(".")[0]
        ns: dict[str, Any] = {
            "__module__": original.__module__,
            "__qualname__": f"{qualname}.{new_name}" if qualname else new_name,
            "__doc__": original.__doc__,
        }
        if dataclasses.is_dataclass(original):
            adopted = _from_stdlib_dataclass(original, ns)
        else:
            annotations = dict(inspect.get_annotations(original))
            ns["__annotations__"] = annotations
            for attr in annotations:
                if attr in original.__dict__:
                    value = original.__dict__[attr]
                    if isinstance(value, dataclasses.Field):
                        # dataclasses.field(...) / flax's field(pytree_node=False) on a plain class.
                        value = from_dataclasses_field(value)
                    ns[attr] = value
            adopted = "__init__" in original.__dict__
            if adopted:
                ns["__init__"] = original.__dict__["__init__"]
        meta = _metaclass_for(original)
        # A stdlib dataclass's generated __init__ is replaced by ours on purpose (its
        # fields were taken over above); any other inherited __init__ is still checked.
        new = meta(
            new_name,
            (original, Struct),
            ns,
            _adopted_init=adopted,
            overwrite_parent_init=dataclasses.is_dataclass(original) and not adopted,
            kw_only=kw_only,
        )
        # The original's class attributes holding field() specs or defaults are now
        # fields of the struct; remove them so they cannot shadow instance values.
        for attr in list(ns.get("__annotations__", {})):
            value = original.__dict__.get(attr, MISSING)
            if isinstance(value, FieldSpec):
                try:
                    delattr(original, attr)
                except (AttributeError, TypeError):
                    pass
        return new

    if cls is None:
        return wrap
    return wrap(cls)


if TYPE_CHECKING:
    # mypy does not carry dataclass_transform through a plain alias assignment, so
    # type checkers see a declaration of their own; at runtime it is the same function.
    @overload
    def dataclass(cls: T, /) -> T: ...
    @overload
    def dataclass(*, name: str | None = None, kw_only: bool = False) -> Callable[[T], T]: ...
    @dataclass_transform(
        frozen_default=True, field_specifiers=(field, FieldSpec, dataclasses.field)
    )
    def dataclass(cls: Any = None, /, *, name: str | None = None, kw_only: bool = False) -> Any:
        """Alias of :func:`register_class`."""

else:
    dataclass = register_class
    """Alias of :func:`register_class`, for code that thinks of structs as frozen dataclasses."""
