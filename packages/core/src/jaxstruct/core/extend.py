"""Extension points for libraries that build on struct classes.

``jaxstruct.abc`` (abstract vars, ``abstract=``) and the built-in ``typecheck=``
and ``optree_namespace=`` keywords use these; a third-party package can too.
Every callback runs once per class, at class definition, before the class is
registered as a pytree: raising :class:`StructDefinitionError` there rejects
the class and leaves no trace in any registry.

Example:
    >>> import jaxstruct.core as js
    >>> from jaxstruct.core import extend
    >>> seen = []
    >>> extend.add_class_keyword("label", lambda cls, value: seen.append((cls.__name__, value)))
    >>> class Tagged(js.Struct, label="demo"):
    ...     x: int
    >>> seen
    [('Tagged', 'demo')]
    >>> js.class_options(Tagged)["label"]
    'demo'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._meta import class_created_hooks, extension_keywords, not_a_field_names

__all__ = ["add_class_hook", "add_class_keyword", "add_non_field_marker"]


def add_class_keyword(name: str, callback: Callable[[type, Any], None]) -> None:
    """Accept ``class C(Struct, name=value)``, calling ``callback(C, value)`` for it.

    The value is also kept in :func:`jaxstruct.core.class_options` and
    inherited by subclasses (the callback runs for the class that spells it).
    Registering the same name again replaces its callback.

    Raises:
        ValueError: ``name`` is not an identifier, or is a keyword ``Struct``
            itself understands (``init``, ``overwrite_parent_init``).
    """
    if not name.isidentifier() or name in ("init", "overwrite_parent_init", "metaclass"):
        raise ValueError(f"{name!r} cannot be a class keyword; choose another identifier")
    if not callable(callback):
        raise TypeError(f"callback for class keyword {name!r} must be callable")
    extension_keywords[name] = callback


def add_class_hook(hook: Callable[[type], None]) -> None:
    """Call ``hook(cls)`` for every struct class defined from now on (once per hook)."""
    if not callable(hook):
        raise TypeError("a class hook must be callable")
    if hook not in class_created_hooks:
        class_created_hooks.append(hook)


def add_non_field_marker(*names: str) -> None:
    """Treat annotations whose head is one of ``names`` as not declaring a field.

    Like ``ClassVar``: an object annotation is recognised by the attribute
    ``__jaxstruct_not_a_field__`` on it (or on its ``__origin__``); a string
    annotation (``from __future__ import annotations``) by these names.
    """
    not_a_field_names.update(names)
