"""Constraints written in a field's annotation become validators of the field.

``cov: Annotated[Float[Array, "n n"], positive_definite]`` declares a check as
surely as ``js.field(validator=positive_definite)`` does, so the class runs
it. Annotations are read when the class is created; a string annotation
(``from __future__ import annotations``) is evaluated then, in the module and
the scope the class statement runs in, but only when it mentions
``Annotated``. One that cannot be evaluated yet (a name defined further down)
is read again at the first check; one that never can (a name imported only
under ``TYPE_CHECKING``) checks nothing, as type checkers alone can read it.
"""

from __future__ import annotations

import os
import sys
import typing
from collections.abc import Callable
from typing import Any, ClassVar

from ._constraints import Constraint

__all__ = ["annotation_constraints"]

_OUR_FILES = f"{os.sep}jaxstruct{os.sep}"
_UNRESOLVED = object()


def _found(annotation: Any) -> tuple[Constraint, ...]:
    if typing.get_origin(annotation) is not typing.Annotated:
        return ()
    return tuple(m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Constraint))


def _defining_scope() -> tuple[dict[str, Any], dict[str, Any]]:
    """The globals (live) and locals (a copy) of the code running the class statement."""
    frame = sys._getframe(1)
    while frame is not None:
        # By file, not module name: a doctest runs in a copy of a jaxstruct module's globals.
        inside = _OUR_FILES in frame.f_code.co_filename
        name = frame.f_globals.get("__name__", "")
        if not inside and name not in ("abc", "typing", "typing_extensions"):
            return frame.f_globals, dict(frame.f_locals)
        frame = frame.f_back
    return {}, {}


def _evaluate(text: str, scope: tuple[dict[str, Any], dict[str, Any]], body: dict[str, Any]) -> Any:
    defining_globals, defining_locals = scope
    names = {**defining_locals, **body}
    try:
        return eval(text, defining_globals, names)
    except Exception:  # a name not defined yet, or only for type checkers
        return _UNRESOLVED


class LateConstraints(Constraint):
    """The constraints of a string annotation that could not be evaluated with its class.

    Evaluated again at the first check; its constraints then run as if written
    with the class.
    """

    __slots__ = ("_body", "_found", "_scope", "_text")
    kind: ClassVar[str] = "annotation"  # jaxstruct.testing reads the annotation itself

    def __init__(
        self, text: str, scope: tuple[dict[str, Any], dict[str, Any]], body: dict[str, Any]
    ) -> None:
        self._text = text
        self._scope = scope
        self._body = body
        self._found: tuple[Constraint, ...] | None = None

    def constraints(self) -> tuple[Constraint, ...]:
        """The constraints the annotation holds (none while it cannot be evaluated)."""
        if self._found is None:
            resolved = _evaluate(self._text, self._scope, self._body)
            # Unresolvable when the first instance is built: names only type checkers see.
            self._found = () if resolved is _UNRESOLVED else _found(resolved)
        return self._found

    def explain(self, value: Any) -> str | None:
        found = self.constraints()
        for constraint in found:
            why = constraint.explain(value)
            if why is not None:
                return why if len(found) == 1 else f"{constraint!r}: {why}"
        return None

    def _key(self) -> tuple[Any, ...]:
        return (self._text,)

    def __repr__(self) -> str:
        found = self._found
        if found:
            return ", ".join(map(repr, found))
        return f"the constraints of {self._text!r}"


def annotation_constraints(annotation: Any, body: dict[str, Any]) -> tuple[Callable[..., Any], ...]:
    """The constraints ``annotation`` carries as ``Annotated`` metadata, as validators.

    ``body`` is the class namespace (names defined in the class body).

    Example:
        >>> from typing import Annotated
        >>> from jaxstruct.core.constraints import finite
        >>> annotation_constraints(Annotated[float, finite, "a note"], {})
        (finite,)
        >>> annotation_constraints(float, {})
        ()
    """
    if isinstance(annotation, str):
        if "Annotated" not in annotation:
            return ()  # the common case costs one substring test
        scope = _defining_scope()
        resolved = _evaluate(annotation, scope, body)
        if resolved is _UNRESOLVED:
            return (LateConstraints(annotation, scope, dict(body)),)
        annotation = resolved
    return _found(annotation)
