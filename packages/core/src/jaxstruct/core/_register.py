"""``register_class``/``dataclass``: promote an existing class to a Struct."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from typing_extensions import dataclass_transform

from ._errors import StructDefinitionError
from ._fields import MISSING, FieldSpec, field, from_dataclasses_field
from ._meta import StructMeta, is_initvar
from ._struct import Struct

__all__ = ["dataclass", "register_class"]

T = TypeVar("T", bound=type)

#: Where the docs say how to port a chex library (tests check the section exists).
_PORTING_CHEX = "docs/coming-from.md, section 'Porting a chex library'"

#: The keywords of ``dataclasses.dataclass`` and ``chex.dataclass`` with the one
#: value a struct class always has (so passing it changes nothing), and why any
#: other value is refused, with the way out.
_FIXED_KEYWORDS: dict[str, tuple[bool, str]] = {
    "frozen": (
        True,
        "struct instances are always frozen, because JAX treats them as values; derive "
        "changed copies with .replace(...), or keep mutable state in an opaque field "
        "(field(pytree=False))",
    ),
    "eq": (
        True,
        "== and hash() are always by field value (arrays by value); define __eq__ and "
        "__hash__ in the class body to change them",
    ),
    "repr": (True, "define __repr__ in the class body to replace the generated one"),
    "order": (
        False,
        "structs hold arrays, which have no total order; define __lt__ and the others in "
        "the class body (functools.total_ordering helps)",
    ),
    "slots": (
        False,
        "jaxstruct lays out instance attributes itself; __slots__ would make flattening "
        "slower, not faster",
    ),
    "weakref_slot": (False, "struct instances support weak references already"),
    "mappable_dataclass": (
        False,
        "a struct is no Mapping; write obj.name or getattr(obj, name) for obj[name], "
        "obj.to_dict() for dict(obj) and **obj, obj.to_dict().keys() (.values(), .items()) "
        "for obj.keys() (.values(), .items()); libraries that walk mappings (dm-tree, "
        "tf.nest) see a struct as one leaf, use jax.tree_util there "
        f"({_PORTING_CHEX})",
    ),
}


def _check_keywords(cls: type, keywords: dict[str, Any]) -> None:
    """Refuse a dataclass or chex keyword a struct class cannot honour, naming the fix."""
    for key, value in keywords.items():
        fixed = _FIXED_KEYWORDS.get(key)
        if fixed is None:
            known = ", ".join(f"{k}={v[0]}" for k, v in _FIXED_KEYWORDS.items())
            raise StructDefinitionError(
                f"{cls.__qualname__}: register_class() (js.dataclass) does not know the keyword "
                f"{key}=; it takes name=, kw_only=, init=, match_args=, unsafe_hash= and, at "
                f"the value every struct has, {known}"
            )
        if bool(value) is not fixed[0]:
            raise StructDefinitionError(
                f"{cls.__qualname__}: register_class() (js.dataclass) cannot make a struct class "
                f"with {key}={value!r}: {fixed[1]}. Drop {key}= (or pass {key}={fixed[0]})"
            )


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
def register_class(
    *,
    name: str | None = None,
    kw_only: bool = False,
    init: bool = True,
    match_args: bool = True,
    unsafe_hash: bool = False,
    frozen: bool = True,
    eq: bool = True,
    repr: bool = True,
    order: bool = False,
    slots: bool = False,
    weakref_slot: bool = False,
    mappable_dataclass: bool = False,
) -> Callable[[T], T]: ...
@dataclass_transform(frozen_default=True, field_specifiers=(field, FieldSpec, dataclasses.field))
def register_class(
    cls: Any = None,
    /,
    *,
    name: str | None = None,
    kw_only: bool = False,
    init: bool = True,
    match_args: bool = True,
    unsafe_hash: bool = False,
    **keywords: Any,
) -> Any:
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

    The keywords of ``dataclasses.dataclass`` and ``chex.dataclass`` are
    taken at the values every struct has, so that ``@dataclass(frozen=True)``
    ports unchanged: ``frozen=True``, ``eq=True``, ``repr=True``,
    ``order=False``, ``slots=False``, ``weakref_slot=False`` and
    ``mappable_dataclass=False``; ``unsafe_hash`` either way (a struct always
    hashes by field value). Any other value, or an unknown keyword, is a
    :class:`StructDefinitionError` naming the keyword and what to write instead.
    A generic class (``Generic[T]``, or ``class Box[T]`` on Python 3.12+) stays
    generic: ``Box[int]`` works on the new class.

    Args:
        cls: the class to promote.
        name: register (and name) the new class under this name instead.
        kw_only: make the class's own fields keyword-only (as the class keyword does).
        init: ``False`` keeps the ``__init__`` the class defines (it is kept anyway);
            a class without one has nothing to keep, and is refused.
        match_args: set ``__match_args__`` (positional ``match`` patterns), as dataclasses do.
        unsafe_hash: accepted either way: structs hash by field value.
        **keywords: the dataclass and chex keywords above, at the values structs have.

    Returns:
        The new struct class.

    Raises:
        StructDefinitionError: a keyword a struct class cannot honour, or ``init=False``
            on a class without its own ``__init__``.
        TypeError: ``cls`` is not a class, or is a struct already and a keyword would
            change it.

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

    del unsafe_hash  # either way: a struct always hashes by field value

    def wrap(original: type) -> type:
        if not isinstance(original, type):
            raise TypeError(f"register_class() expected a class, got {original!r}")
        _check_keywords(original, keywords)
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
        if not init and not adopted:
            raise StructDefinitionError(
                f"{original.__qualname__}: register_class(init=False) keeps the class's own "
                "__init__, but it defines none; drop init=False to get the generated "
                "constructor, or define __init__ in the class"
            )
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
            match_args=match_args,
        )
        parameters = original.__dict__.get("__parameters__")
        if parameters:
            # typing.Generic collects a class's type parameters from the bases it was
            # written with (__orig_bases__); the new class has none of its own, so
            # without this Box[int] would say "not a generic class".
            type.__setattr__(new, "__parameters__", parameters)
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
    def dataclass(
        *,
        name: str | None = None,
        kw_only: bool = False,
        init: bool = True,
        match_args: bool = True,
        unsafe_hash: bool = False,
        frozen: bool = True,
        eq: bool = True,
        repr: bool = True,
        order: bool = False,
        slots: bool = False,
        weakref_slot: bool = False,
        mappable_dataclass: bool = False,
    ) -> Callable[[T], T]: ...
    @dataclass_transform(
        frozen_default=True, field_specifiers=(field, FieldSpec, dataclasses.field)
    )
    def dataclass(cls: Any = None, /, **options: Any) -> Any:
        """Alias of :func:`register_class`."""

else:
    dataclass = register_class
    """Alias of :func:`register_class`, for code that thinks of structs as frozen dataclasses."""
