"""``StructABCMeta``: the metaclass for abstract struct base classes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxstruct.core import StructMeta

__all__ = ["StructABCMeta"]


class StructABCMeta(StructMeta):
    """Metaclass combining struct processing with ABC enforcement, for abstract struct bases.

    ``StructMeta`` already derives from :class:`abc.ABCMeta`, so this class
    adds only a clearer error when an abstract struct is instantiated: it
    names the abstract methods and the abstract vars still missing. Abstract
    vars, ``abstract=True`` and ``__check_init__`` work with either metaclass.

    Raises:
        TypeError: on instantiating a class with abstract methods or vars left.

    Example:
        >>> import abc
        >>> import jaxstruct.core as js
        >>> from jaxstruct.abc import StructABCMeta
        >>> class AbstractSolver(js.Struct, metaclass=StructABCMeta):
        ...     lr: float = js.field(static=True)
        ...     @abc.abstractmethod
        ...     def step(self, params): ...
        >>> class SGD(AbstractSolver):
        ...     def step(self, params):
        ...         return params - self.lr
        >>> SGD(lr=0.5).step(1.0)
        0.5
        >>> AbstractSolver(lr=0.1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: Can't instantiate abstract struct AbstractSolver: abstract method 'step' is ...
    """

    if not TYPE_CHECKING:
        # Hidden from type checkers: a metaclass __call__ would replace the
        # constructor signature they derive from the fields.
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            missing = cls.__abstractmethods__
            if missing:
                raise TypeError(_describe(cls, missing))
            return super().__call__(*args, **kwargs)


def _describe(cls: type, missing: frozenset[str]) -> str:
    abstract_vars = getattr(cls, "__abstractvars__", frozenset())
    abstract_class_vars = getattr(cls, "__abstractclassvars__", frozenset())
    methods = sorted(missing - abstract_vars - abstract_class_vars)
    parts: list[str] = []
    for names, singular, plural in (
        (methods, "abstract method", "abstract methods"),
        (sorted(abstract_vars & missing), "AbstractVar", "AbstractVars"),
        (sorted(abstract_class_vars & missing), "AbstractClassVar", "AbstractClassVars"),
    ):
        if names:
            label = singular if len(names) == 1 else plural
            parts.append(f"{label} {', '.join(map(repr, names))}")
    verb = "is" if len(missing) == 1 else "are"
    return (
        f"Can't instantiate abstract struct {cls.__qualname__}: {' and '.join(parts)} {verb} "
        f"not implemented; subclass it and provide {'it' if len(missing) == 1 else 'them'}"
    )
