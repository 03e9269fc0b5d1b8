"""The ``AbstractVar`` and ``AbstractClassVar`` annotations, and how annotations are classified.

Under a type checker the two markers are aliases (equinox's trick):
``AbstractVar[T]`` reads as an instance attribute of type ``T`` and
``AbstractClassVar[T]`` as ``ClassVar[T]``, so ``self.name`` type-checks in
the abstract base. At runtime they are generic marker classes that
``jaxstruct.core`` skips when it collects fields.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, Literal, TypeVar

from jaxstruct.core import StructDefinitionError

__all__ = ["AbstractClassVar", "AbstractVar", "classify"]

_T = TypeVar("_T")

if TYPE_CHECKING:
    from typing import ClassVar as AbstractClassVar
    from typing import TypeAlias

    AbstractVar: TypeAlias = Annotated[_T, "AbstractVar"]
else:

    class AbstractVar(Generic[_T]):
        """Annotation declaring an abstract instance attribute: concrete subclasses must provide it.

        A concrete subclass provides it with a field of the same name (any
        kind), a property, or a class attribute. The declaration itself is not
        a field: it never appears in the constructor or the pytree.

        Example:
            >>> import jaxstruct.core as js
            >>> from jaxstruct.abc import AbstractVar
            >>> class Named(js.Struct):
            ...     name: AbstractVar[str]
            >>> class Dog(Named):
            ...     name: str = js.field(static=True, default="rex")
            >>> Dog().name
            'rex'
        """

        __slots__ = ()
        __jaxstruct_not_a_field__ = True

    class AbstractClassVar(Generic[_T]):
        """Annotation declaring an abstract class attribute: concrete subclasses must set it.

        A concrete subclass provides it as a class attribute
        (``name: ClassVar[T] = value`` or ``name = value``), never as a field.

        Example:
            >>> from typing import ClassVar
            >>> import jaxstruct.core as js
            >>> from jaxstruct.abc import AbstractClassVar
            >>> class Layer(js.Struct):
            ...     kind: AbstractClassVar[str]
            >>> class Dense(Layer):
            ...     kind: ClassVar[str] = "dense"
            >>> Dense.kind
            'dense'
        """

        __slots__ = ()
        __jaxstruct_not_a_field__ = True


Kind = Literal["var", "classvar", "plain-classvar", "other"]

_STRING_KINDS: dict[str, Kind] = {
    "AbstractVar": "var",
    "AbstractClassVar": "classvar",
    "ClassVar": "plain-classvar",
}


def classify(owner: str, name: str, annotation: object) -> Kind:
    """Say what an annotation declares: an abstract var, an abstract class var, a ClassVar, other.

    String annotations (``from __future__ import annotations``) are read by
    their head name, as ``jaxstruct.core`` does.

    Raises:
        StructDefinitionError: a bare ``AbstractVar`` or one with several arguments.
    """
    if isinstance(annotation, str):
        head = annotation.replace(" ", "").split("[", 1)[0].rpartition(".")[2]
        if head in ("AbstractVar", "AbstractClassVar") and "[" not in annotation:
            raise _bare(owner, name, head)
        return _STRING_KINDS.get(head, "other")
    if annotation is AbstractVar or annotation is AbstractClassVar:
        raise _bare(owner, name, "AbstractVar" if annotation is AbstractVar else "AbstractClassVar")
    origin: Any = typing.get_origin(annotation)
    if origin is AbstractVar or origin is AbstractClassVar:
        marker = "AbstractVar" if origin is AbstractVar else "AbstractClassVar"
        if len(typing.get_args(annotation)) != 1:
            raise StructDefinitionError(
                f"{owner}: {name!r} is annotated {annotation!r}; {marker} takes exactly "
                f"one type, e.g. {name}: {marker}[int]"
            )
        return "var" if origin is AbstractVar else "classvar"
    if origin is ClassVar or annotation is ClassVar:
        return "plain-classvar"
    return "other"


def _bare(owner: str, name: str, marker: str) -> StructDefinitionError:
    return StructDefinitionError(
        f"{owner}: {name!r} is annotated with a bare {marker}; say what type it holds, "
        f"e.g. {name}: {marker}[int]"
    )
