"""Abstract vars on struct classes: which ones a class still owes, and the check on concrete ones.

This module plugs into ``jaxstruct.core`` through its extension points when it
is imported (``AbstractVar`` cannot be used without importing it):

* ``not_a_field_names`` learns the marker names, so string annotations
  (``from __future__ import annotations``) are skipped like ``ClassVar``;
* a class-created hook computes, for every new struct class, the abstract
  vars it still owes and rejects a *concrete* class that owes any;
* the class keyword ``abstract=True`` marks an intermediate class abstract.

A class is **abstract** when it has abstract methods left, declares an
``AbstractVar``/``AbstractClassVar`` in its own body, or is defined with
``abstract=True``. Every other struct class is **concrete**. An abstract class
that still owes abstract vars cannot be instantiated: they are added to its
``__abstractmethods__``, so Python's own ABC machinery refuses it.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import jaxstruct.core as js
from jaxstruct.core import StructDefinitionError, extend

from ._markers import classify

__all__ = ["ABSTRACT_FLAG", "install", "is_abstract", "owed"]

#: Class attribute set (in the class's own ``__dict__``) by ``abstract=True``.
ABSTRACT_FLAG = "__jaxstruct_abstract__"

MISSING_HELP = """\
A concrete struct class must provide every AbstractVar and AbstractClassVar it
inherits. For example:

    class AbstractModel(js.Struct):
        name: AbstractVar[str]
        kind: AbstractClassVar[str]

    class Model(AbstractModel):            # wrong: provides neither
        weights: object

    class Model(AbstractModel):            # right
        weights: object
        name: str = js.field(static=True, default="model")
        kind: ClassVar[str] = "dense"

If the class is meant to stay abstract, define it with abstract=True:

    class PartialModel(AbstractModel, abstract=True):
        name: str = js.field(static=True, default="model")
"""


def _own_annotations(kls: type) -> dict[str, Any]:
    if sys.version_info >= (3, 14):  # pragma: no cover - lazy annotations may name later classes
        import annotationlib  # type: ignore[import-not-found]

        return dict(annotationlib.get_annotations(kls, format=annotationlib.Format.FORWARDREF))
    return inspect.get_annotations(kls)


def owed(cls: type) -> tuple[dict[str, type], dict[str, type], bool]:
    """Return the abstract vars and class vars ``cls`` still owes (name to declaring class).

    The third item says whether ``cls``'s own body declares an abstract var.
    Follows equinox's rule: walk the MRO from ``object`` down; an abstract
    annotation adds a debt, a field or any class attribute of that name pays it.

    Raises:
        StructDefinitionError: an abstract declaration with a value, or a field
            trying to provide an ``AbstractClassVar``.
    """
    abstract_vars: dict[str, type] = {}
    abstract_class_vars: dict[str, type] = {}
    declares = False
    for kls in reversed(cls.__mro__):
        annotations = _own_annotations(kls)
        is_struct = js.is_struct(kls)
        for name, annotation in annotations.items():
            kind = classify(kls.__qualname__, name, annotation)
            if kind in ("var", "classvar"):
                if kls is cls:
                    declares = True
                if name in kls.__dict__:
                    marker = "AbstractVar" if kind == "var" else "AbstractClassVar"
                    raise StructDefinitionError(
                        f"{kls.__qualname__}: {name!r} is declared {marker} but also given a "
                        f"value; an abstract declaration only says subclasses must provide it. "
                        f"Drop the value, or drop {marker} to make it an ordinary "
                        f"{'field' if kind == 'var' else 'class attribute'}"
                    )
                if kind == "classvar":
                    abstract_vars.pop(name, None)
                    abstract_class_vars[name] = kls
                elif name not in abstract_class_vars:
                    abstract_vars[name] = kls
            elif kind == "other" and is_struct:
                # An ordinary annotation in a struct body is a field.
                if name in abstract_class_vars:
                    owner = abstract_class_vars[name].__qualname__
                    raise StructDefinitionError(
                        f"{kls.__qualname__}: {name!r} is an AbstractClassVar of {owner}, so it "
                        f"must be a class attribute, but it is declared as a field; write "
                        f"{name}: ClassVar[...] = value"
                    )
                abstract_vars.pop(name, None)
        for name in kls.__dict__:
            abstract_vars.pop(name, None)
            abstract_class_vars.pop(name, None)
    return abstract_vars, abstract_class_vars, declares


def _abstract_methods(cls: type) -> set[str]:
    # ABCMeta keeps a name in a subclass's __abstractmethods__ while the attribute
    # still has __isabstractmethod__; the abstract-var names added below never do.
    return {
        name
        for name in getattr(cls, "__abstractmethods__", ())
        if getattr(getattr(cls, name, None), "__isabstractmethod__", False)
    }


def _check_class(cls: type) -> None:
    """Class-created hook: record what ``cls`` owes and reject a concrete class that owes any."""
    abstract_vars, abstract_class_vars, declares = owed(cls)
    if not (abstract_vars or abstract_class_vars):
        if getattr(cls, "__abstractvars__", None) or getattr(cls, "__abstractclassvars__", None):
            # Inherited from an abstract base; this class owes nothing.
            type.__setattr__(cls, "__abstractvars__", frozenset())
            type.__setattr__(cls, "__abstractclassvars__", frozenset())
        return
    methods = _abstract_methods(cls)
    if methods or declares or cls.__dict__.get(ABSTRACT_FLAG, False):
        type.__setattr__(cls, "__abstractvars__", frozenset(abstract_vars))
        type.__setattr__(cls, "__abstractclassvars__", frozenset(abstract_class_vars))
        type.__setattr__(
            cls,
            "__abstractmethods__",
            frozenset(methods | set(abstract_vars) | set(abstract_class_vars)),
        )
        return
    lines = [
        f"  {name!r} ({'AbstractVar' if name in abstract_vars else 'AbstractClassVar'}, "
        f"declared by {owner.__qualname__})"
        for name, owner in (*abstract_vars.items(), *abstract_class_vars.items())
    ]
    raise StructDefinitionError(
        f"{cls.__qualname__} is concrete (no abstract methods left) but does not provide:\n"
        + "\n".join(lines)
        + f"\nDeclare them in {cls.__qualname__}, or define it with abstract=True to leave "
        "them to its subclasses.\n\n" + MISSING_HELP
    )


def _mark_abstract(cls: type, value: Any) -> None:
    if not isinstance(value, bool):
        raise StructDefinitionError(
            f"{cls.__qualname__}: abstract= expects True or False, got {value!r}"
        )
    type.__setattr__(cls, ABSTRACT_FLAG, value)
    # The keyword describes this class only; subclasses must not inherit it.
    options = cls.__dict__.get("__struct_options__")
    if isinstance(options, dict):
        options.pop("abstract", None)


def install() -> None:
    """Register the markers, the hook and ``abstract=`` with ``jaxstruct.core`` (idempotent)."""
    extend.add_non_field_marker("AbstractVar", "AbstractClassVar")
    extend.add_class_hook(_check_class)
    extend.add_class_keyword("abstract", _mark_abstract)


def is_abstract(cls: type) -> bool:
    """Return whether a struct class cannot be instantiated (abstract methods or vars left).

    Example:
        >>> import abc
        >>> import jaxstruct.core as js
        >>> from jaxstruct.abc import is_abstract
        >>> class Base(js.Struct):
        ...     @abc.abstractmethod
        ...     def run(self): ...
        >>> is_abstract(Base)
        True
    """
    return inspect.isabstract(cls)
