"""The flattened forms a struct instance caches for JAX, built on first use.

JAX flattens a struct with ``operator.attrgetter`` of one instance attribute,
so flattening never calls Python once the attribute exists. Construction does
not build it: the class-level descriptors below are *non-data* descriptors,
so an instance's own attribute wins over them, and only the first flatten of
an instance reaches their ``__get__``, which builds the form and stores it on
the instance. Unflatten stores the form it was given right away.

While an instance is still being built (``__post_init__``, a user's
``__init__``) its fields may change, so the forms are computed but not kept.
"""

from __future__ import annotations

from typing import Any

from ._codegen import generate_flat
from ._layout import FLAT, KEYED
from ._lifecycle import building

__all__ = ["FlatForm", "KeyedForm", "refresh"]

_osa = object.__setattr__
_oda = object.__delattr__


class FlatForm:
    """Class attribute ``_jaxstruct_flat``: builds and caches ``(children, aux)``."""

    __slots__ = ()

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        layout = (owner or type(obj)).__struct_layout__
        # The per-class function builds the pair and stores it on the instance.
        return (layout.flat_of or generate_flat(layout))(obj)


class KeyedForm:
    """Class attribute ``_jaxstruct_keyed``: builds and caches ``(((key, child), ...), aux)``."""

    __slots__ = ()

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        children, aux = getattr(obj, FLAT)
        keys = type(obj).__struct_layout__.keys
        pair = (tuple(zip(keys, children, strict=True)), aux)
        if id(obj) not in building():
            _osa(obj, KEYED, pair)
        return pair


def refresh(obj: Any) -> None:
    """Forget the cached forms of ``obj`` after its fields changed in place (``rederive``)."""
    for name in (FLAT, KEYED):
        try:
            _oda(obj, name)
        except AttributeError:
            pass
