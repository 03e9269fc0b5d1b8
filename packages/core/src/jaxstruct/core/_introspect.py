"""Module-level introspection wrappers and ``build``."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, TypeVar

from ._fields import FieldSpec
from ._layout import Layout
from ._lifecycle import new_from_values

__all__ = [
    "build",
    "derived_fields",
    "fields",
    "has_custom_init",
    "is_struct",
    "node_fields",
    "opaque_fields",
    "static_fields",
]

T = TypeVar("T")


def _layout(cls_or_obj: Any) -> Layout:
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    layout = getattr(cls, "__struct_layout__", None)
    if layout is None:
        raise TypeError(
            f"expected a Struct class or instance, got {getattr(cls, '__qualname__', cls)!r}"
        )
    return layout


def is_struct(cls_or_obj: Any) -> bool:
    """Return whether ``cls_or_obj`` is a struct class or instance (not the ``Struct`` base).

    Example:
        >>> is_struct(int)
        False
    """
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    return getattr(cls, "__struct_layout__", None) is not None


def has_custom_init(cls_or_obj: Any) -> bool:
    """Return whether a struct class has a hand-written ``__init__``.

    Such a class takes its own arguments, not one keyword per field, so code
    that makes instances from field values should call :func:`build`.

    Example:
        >>> import jaxstruct.core as js
        >>> class Scaled(js.Struct):
        ...     x: float
        ...     def __init__(self, raw, scale=2.0):
        ...         self.x = raw * scale
        >>> js.has_custom_init(Scaled), js.build(Scaled, {"x": 1.0})
        (True, Scaled(x=1.0))
    """
    return _layout(cls_or_obj).user_init


def fields(cls_or_obj: Any) -> OrderedDict[str, FieldSpec]:
    """Return the ordered mapping of field name to :class:`FieldSpec` of a struct class or instance.

    Example:
        >>> import jaxstruct.core as js
        >>> class P(js.Struct):
        ...     x: int
        ...     tag: str = js.field(static=True, default="a")
        >>> list(js.fields(P)), js.fields(P)["tag"].kind
        (['x', 'tag'], <FieldKind.STATIC: 'static'>)
    """
    return OrderedDict((f.name, f) for f in _layout(cls_or_obj).fields)


def node_fields(cls_or_obj: Any) -> tuple[str, ...]:
    """Return the node field names of a struct class or instance."""
    return _layout(cls_or_obj).node_names


def static_fields(cls_or_obj: Any) -> tuple[str, ...]:
    """Return the static field names of a struct class or instance."""
    return _layout(cls_or_obj).static_names


def opaque_fields(cls_or_obj: Any) -> tuple[str, ...]:
    """Return the opaque field names of a struct class or instance."""
    return _layout(cls_or_obj).opaque_names


def derived_fields(cls_or_obj: Any) -> tuple[str, ...]:
    """Return the derived field names of a struct class or instance."""
    return tuple(f.name for f in _layout(cls_or_obj).derived)


def build(cls: type[T], values: Mapping[str, Any], *, convert: bool = True) -> T:
    """Create an instance from field values without calling ``__init__`` or ``__post_init__``.

    Converters run on the given values (unless ``convert=False``), defaults fill
    absent fields, derived fields are recomputed, and validators and
    ``__check_init__`` run. This is how deserialisation rebuilds structs.

    Raises:
        ValidationError: an unknown or missing field, or a rejected value.

    Example:
        >>> import jaxstruct.core as js
        >>> class P(js.Struct):
        ...     x: int = js.field(converter=int)
        ...     y: int = 0
        >>> js.build(P, {"x": "3"})
        P(x=3, y=0)
    """
    return new_from_values(cls, _layout(cls), values, convert=convert)
