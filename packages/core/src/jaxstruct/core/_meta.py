"""``StructMeta``: turns a class body into a frozen, registered pytree class.

All work here happens once per class; see ``_codegen`` for what is deferred to
the first instance. The safety checks follow penzai's ``pytree_dataclass``:
each mistake that dataclass inheritance would silently accept is an error at
class definition naming the class, the field and the ways out.
"""

from __future__ import annotations

import abc
import operator
import typing
from collections.abc import Callable
from typing import Any

import jax
from jaxstruct.registry import PytreeSpec, add_spec
from typing_extensions import dataclass_transform

from ._codegen import lazy_init, lazy_unflatten
from ._errors import StructDefinitionError
from ._fields import MISSING, FieldSpec, field
from ._layout import FLAT, KEYED, Layout
from ._userinit import wrap_user_init

__all__ = ["StructMeta", "class_options", "extension_keywords"]

# Both read a per-instance cache (built on first use, see _cache): JAX
# flattens a struct without calling Python.
_flatten = operator.attrgetter(FLAT)
_flatten_with_keys = operator.attrgetter(KEYED)

_new = object.__new__
_osa = object.__setattr__

#: Names of the ``Struct`` API that a field may not shadow on instances.
RESERVED = frozenset(
    {
        "replace",
        "rederive",
        "fields",
        "node_fields",
        "static_fields",
        "opaque_fields",
        "derived_fields",
        "tree_size",
        "to_dict",
        "to_state_dict",
        "from_state_dict",
        "export",
        "load",
        "select",
    }
)

#: Class keywords understood by extensions, with the callback applying each
#: (``callback(cls, value)``, before the class is registered as a pytree).
extension_keywords: dict[str, Callable[[type, Any], None]] = {}

#: Called with every new struct class, after its layout is set and before it is
#: registered as a pytree; raising rejects the class.
class_created_hooks: list[Callable[[type], None]] = []

#: Annotation markers that declare something other than a field (like
#: ``ClassVar``): objects whose ``__origin__`` (or themselves) carry the
#: attribute ``__jaxstruct_not_a_field__``, and these names for string
#: annotations. Extensions (``jaxstruct.abc``'s ``AbstractVar``) add to it.
not_a_field_names: set[str] = {"ClassVar"}

_MUTABLE_DEFAULTS = (list, dict, set, bytearray)

SHADOW_HELP = """\
A subclass redeclared an inherited field. With dataclass-style inheritance the
new declaration silently replaces the parent's (and keeps its position), which
usually hides a typo or a copy-paste. Either drop the annotation to inherit the
field as is, or declare the replacement explicitly:

    class Child(Parent):
        lr: float = field(static=True, default=0.1, override=True)
"""


def class_options(cls: type) -> dict[str, Any]:
    """Return the class keywords a struct class was defined with (inherited ones included)."""
    return dict(getattr(cls, "__struct_options__", {}))


def _own_annotations(ns: dict[str, Any]) -> dict[str, Any]:
    ann = ns.get("__annotations__")
    if ann is not None:
        return dict(ann)
    annotate = ns.get("__annotate__")
    if annotate is None:
        return {}
    # Python 3.14+: annotations are evaluated lazily; ask for forward references.
    import annotationlib  # type: ignore[import-not-found]

    return dict(annotationlib.call_annotate_function(annotate, annotationlib.Format.FORWARDREF))


def _is_classvar(annotation: Any) -> bool:
    """Whether an annotation declares a class variable or another non-field (``AbstractVar``)."""
    if isinstance(annotation, str):
        head = annotation.replace(" ", "").split("[", 1)[0].rpartition(".")[2]
        return head in not_a_field_names
    origin = getattr(annotation, "__origin__", annotation)
    return origin is typing.ClassVar or bool(getattr(origin, "__jaxstruct_not_a_field__", False))


def _fail(cls_name: str, message: str) -> StructDefinitionError:
    return StructDefinitionError(f"{cls_name}: {message}")


@dataclass_transform(frozen_default=True, field_specifiers=(field, FieldSpec))
class StructMeta(abc.ABCMeta):
    """Metaclass of :class:`Struct`: collects fields, checks the declaration, registers the pytree.

    It derives from :class:`abc.ABCMeta`, so ``Struct`` mixes with ``abc.ABC``
    without a metaclass conflict and ``@abstractmethod`` is enforced.
    """

    def __new__(
        mcls,
        name: str,
        bases: tuple[type, ...],
        ns: dict[str, Any],
        /,
        *,
        init: bool = True,
        overwrite_parent_init: bool = False,
        _adopted_init: bool = False,
        **kwargs: Any,
    ) -> StructMeta:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in extension_keywords}
        if not any(isinstance(b, StructMeta) for b in bases):
            # The Struct base class itself.
            return super().__new__(mcls, name, bases, ns, **kwargs)
        qual = ns.get("__qualname__", name)
        inherited: dict[str, FieldSpec] = {}
        for base in reversed(bases):
            for klass in reversed(base.__mro__):
                layout = klass.__dict__.get("__struct_layout__")
                if layout is not None:
                    for spec in layout.fields:
                        inherited[spec.name] = spec
        own = _collect_own_fields(qual, ns, inherited)
        user_init = ns.get("__init__")
        if user_init is not None:
            if not init and not _adopted_init:
                raise _fail(
                    qual, "init=False conflicts with the __init__ defined in the class body"
                )
            ns["__init__"] = wrap_user_init(user_init)
        cls = super().__new__(mcls, name, bases, ns, **kwargs)
        fields = dict(inherited)
        for spec in own:
            spec.owner = cls
            fields[spec.name] = spec
        ordered = tuple(fields.values())
        _check_order(qual, ordered)
        has_user_init = user_init is not None
        if user_init is None:
            inherited_user = _inherits_user_init(cls)
            if not init or (inherited_user and not own):
                # Keep the inherited __init__ (a subclass adding no fields, or init=False).
                has_user_init = inherited_user
            else:
                _check_parent_init(cls, qual, overwrite_parent_init)
                type.__setattr__(cls, "__init__", lazy_init(cls))
        layout = Layout(cls, ordered, user_init=has_user_init)
        type.__setattr__(cls, "__struct_layout__", layout)
        type.__setattr__(
            cls,
            "__match_args__",
            tuple(f.name for f in layout.init_fields if not f.kw_only),
        )
        merged = dict(getattr(cls, "__struct_options__", {}))
        merged.update(options)
        type.__setattr__(cls, "__struct_options__", merged)
        # Extensions see (and may reject) the class before JAX does: a class
        # that fails a check is never registered anywhere.
        for key, value in options.items():
            extension_keywords[key](cls, value)
        for hook in class_created_hooks:
            hook(cls)
        _register(cls, layout)
        _reserve_attribute_slots(cls, layout)
        return cls

    @property
    def __signature__(cls) -> Any:
        """The constructor signature (generating the constructor if needed)."""
        if "__struct_layout__" not in cls.__dict__:
            return None
        import inspect

        from ._codegen import generate_init

        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_jaxstruct_generated", False):
            init = generate_init(cls) if "__init__" in cls.__dict__ else cls.__init__
        sig = inspect.signature(init)
        params = list(sig.parameters.values())[1:]
        return sig.replace(parameters=params)


def _collect_own_fields(
    qual: str, ns: dict[str, Any], inherited: dict[str, FieldSpec]
) -> list[FieldSpec]:
    own: list[FieldSpec] = []
    annotations = _own_annotations(ns)
    for fname, annotation in annotations.items():
        if _is_classvar(annotation):
            continue
        if fname.startswith(("_jaxstruct", "_js_")):
            raise _fail(
                qual, f"field name {fname!r} uses a prefix reserved for jaxstruct; rename it"
            )
        if fname in RESERVED:
            raise _fail(
                qual,
                f"field {fname!r} would shadow the Struct method of that name on every instance; "
                "rename the field",
            )
        value = ns.pop(fname, MISSING)
        if isinstance(value, FieldSpec):
            spec = value._copy()
        else:
            if isinstance(value, _MUTABLE_DEFAULTS):
                raise _fail(
                    qual,
                    f"field {fname!r} has a mutable default {type(value).__name__}, which every "
                    f"instance would share; use field(default_factory={type(value).__name__}) "
                    "instead",
                )
            spec = FieldSpec(default=value)
        spec.name = fname
        spec.type = annotation
        for problem in spec._problems:
            raise _fail(qual, f"field {fname!r}: {problem}")
        if fname in inherited and not spec.override:
            parent = inherited[fname].owner
            pname = parent.__qualname__ if parent is not None else "a parent"
            raise _fail(
                qual,
                f"field {fname!r} shadows the field inherited from {pname}; drop the annotation "
                f"to inherit it, or pass override=True to field() to replace it deliberately.\n"
                + SHADOW_HELP,
            )
        if spec.override and fname not in inherited:
            raise _fail(
                qual, f"field {fname!r} has override=True but no parent declares it; drop override"
            )
        own.append(spec)
    for attr, value in list(ns.items()):
        if isinstance(value, FieldSpec):
            raise _fail(
                qual,
                f"{attr!r} is assigned field(...) but has no type annotation; annotate it "
                f"({attr}: int = field(...)) or remove the field() call",
            )
        if attr in inherited and attr not in annotations and not attr.startswith("__"):
            raise _fail(
                qual,
                f"class attribute {attr!r} silently shadows the inherited field {attr!r}; "
                f"to change its default redeclare it ({attr}: ... = field(default=..., "
                "override=True)), or rename the attribute",
            )
    return own


def _check_order(qual: str, fields: tuple[FieldSpec, ...]) -> None:
    seen_default: FieldSpec | None = None
    for spec in fields:
        if not spec.init or spec.kw_only or spec.derived is not None:
            continue
        if spec.has_default:
            seen_default = spec
        elif seen_default is not None:
            raise _fail(
                qual,
                f"required field {spec.name!r} follows field {seen_default.name!r}, which has a "
                f"default; give {spec.name!r} a default, or make it keyword-only with "
                "field(kw_only=True)",
            )


def _first_init(cls: type) -> tuple[type, Any]:
    for klass in cls.__mro__[1:]:
        init = klass.__dict__.get("__init__")
        if init is not None:
            return klass, init
    return object, object.__init__


def _inherits_user_init(cls: type) -> bool:
    return bool(getattr(_first_init(cls)[1], "_jaxstruct_user_init", False))


def _check_parent_init(cls: type, qual: str, overwrite: bool) -> None:
    klass, init = _first_init(cls)
    if overwrite or init is object.__init__ or getattr(init, "_jaxstruct_generated", False):
        return
    raise _fail(
        qual,
        f"the __init__ inherited from {klass.__qualname__} is custom and a generated one would "
        "silently replace it; define __init__ in this class, pass init=False to keep the "
        "inherited one, or pass overwrite_parent_init=True to replace it deliberately",
    )


def _reserve_attribute_slots(cls: type, layout: Layout) -> None:
    """Teach the class every instance attribute name before any real instance exists.

    CPython (3.11+) keeps instance attributes in a compact array laid out by a
    table of names shared by the class, and reads them at full speed only
    while they live there. The table accepts new names freely for the first
    few instances and then only one more: a name first set later (like the
    flattened forms, which are built on first use) would push every instance
    that sets it into a slower per-instance dict. Setting all names once, on a
    throwaway instance, fills the table in time.
    """
    if getattr(cls, "__abstractmethods__", None) or hasattr(cls, "__del__"):
        return  # no instances (abstract), or one that must not see a half-built object
    try:
        scratch = _new(cls)
        for name in (*(spec.name for spec in layout.fields), FLAT, KEYED):
            _osa(scratch, name, None)
    except (TypeError, AttributeError):
        pass  # an unusual class (a read-only descriptor named like a field): no speed-up


def _register(cls: type, layout: Layout) -> None:
    unflatten = lazy_unflatten(cls)
    jax.tree_util.register_pytree_with_keys(cls, _flatten_with_keys, unflatten, _flatten)
    add_spec(
        PytreeSpec(
            cls,
            kind="struct",
            flatten=_flatten,
            unflatten=unflatten,
            flatten_with_keys=_flatten_with_keys,
            node_fields=layout.node_names,
            static_fields=layout.static_names,
        )
    )
