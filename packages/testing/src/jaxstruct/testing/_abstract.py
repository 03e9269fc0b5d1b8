"""Which struct classes are abstract, so drawn as their concrete subclasses (no JAX import)."""

from __future__ import annotations

import inspect

__all__ = ["is_abstract_class"]

#: Set in a class's own ``__dict__`` by the ``abstract=True`` class keyword (jaxstruct.abc).
_ABSTRACT_FLAG = "__jaxstruct_abstract__"


def is_abstract_class(cls: type) -> bool:
    """Whether ``cls`` is abstract: abstract methods or vars left, or ``abstract=True``.

    Such a class is drawn as its concrete subclasses, never as itself.
    """
    return inspect.isabstract(cls) or bool(cls.__dict__.get(_ABSTRACT_FLAG, False))
