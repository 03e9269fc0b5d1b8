"""``StructMeta``: turns a class body into a frozen, registered pytree class.

All work here happens once per class; see ``_codegen`` for what is deferred to
the first instance. The safety checks follow penzai's ``pytree_dataclass``:
each mistake that dataclass inheritance would silently accept is an error at
class definition naming the class, the field and the ways out.
"""

from __future__ import annotations

import abc
import dataclasses
import operator
import sys
import typing
from collections.abc import Callable
from typing import Any

import jax
from jaxstruct.registry import PytreeSpec, add_spec, name_classes
from typing_extensions import dataclass_transform

from ._annotated import annotation_constraints
from ._codegen import cooperative_init, lazy_init, lazy_unflatten
from ._dataclass import FIELDS_DESCRIPTOR
from ._errors import StructDefinitionError
from ._fields import MISSING, FieldKind, FieldSpec, field, from_dataclasses_field
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


@dataclass_transform(frozen_default=True, field_specifiers=(field, FieldSpec, dataclasses.field))
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
        kw_only: bool = False,
        frozen: bool = True,
        match_args: bool = True,
        _adopted_init: bool = False,
        **kwargs: Any,
    ) -> StructMeta:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in extension_keywords}
        if not any(isinstance(b, StructMeta) for b in bases):
            # The Struct base class itself.
            return super().__new__(mcls, name, bases, ns, **kwargs)
        qual = ns.get("__qualname__", name)
        if kwargs or not frozen:
            _check_class_keywords(qual, kwargs, frozen)
        inherited: dict[str, FieldSpec] = {}
        for base in reversed(bases):
            for klass in reversed(base.__mro__):
                layout = klass.__dict__.get("__struct_layout__")
                if layout is not None:
                    for spec in layout.members:
                        inherited[spec.name] = spec
        own = _collect_own_fields(qual, ns, inherited, kw_only=kw_only)
        user_init = ns.get("__init__")
        if user_init is not None:
            if not init and not _adopted_init:
                raise _fail(
                    qual, "init=False conflicts with the __init__ defined in the class body"
                )
            ns["__init__"] = wrap_user_init(user_init)
        if "flax.struct" in sys.modules:
            # flax.struct.dataclass returns a class carrying this mark unchanged, so a
            # struct subclass decorated with it (code written for flax) stays as it is.
            ns["_flax_dataclass"] = True
        cls = super().__new__(mcls, name, bases, ns, **kwargs)
        members = dict(inherited)
        for spec in own:
            spec.owner = cls
            members[spec.name] = spec
        ordered = tuple(members.values())
        _check_order(qual, ordered)
        fields = ordered
        if any(spec.initvar for spec in ordered):
            fields = tuple(spec for spec in ordered if not spec.initvar)
        has_user_init = user_init is not None
        if user_init is None:
            klass, inherited_init = _first_init(cls)
            custom = inherited_init is not object.__init__ and not getattr(
                inherited_init, "_jaxstruct_generated", False
            )
            if not init or (custom and not own):
                # Keep the inherited __init__ (a subclass adding no fields, or
                # init=False), whether a struct parent or a plain mixin wrote it.
                if custom and not getattr(inherited_init, "_jaxstruct_user_init", False):
                    type.__setattr__(cls, "__init__", wrap_user_init(inherited_init))
                has_user_init = custom
            else:
                _check_parent_init(cls, qual, overwrite_parent_init, klass, inherited_init)
                type.__setattr__(cls, "__init__", lazy_init(cls))
        if user_init is not None:
            _make_parent_init_cooperative(cls)
        layout = Layout(cls, fields, user_init=has_user_init, members=ordered)
        type.__setattr__(cls, "__struct_layout__", layout)
        # Its own, so that a parent's table (which replaces the parent's descriptor
        # once built, see _dataclass) is never taken for this class's.
        type.__setattr__(cls, "__dataclass_fields__", FIELDS_DESCRIPTOR)
        type.__setattr__(
            cls,
            "__match_args__",
            tuple(f.name for f in layout.init_params if not f.kw_only and not f.initvar)
            if match_args
            else (),
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

        from ._codegen import generate_init_for_signature, resolve_hint

        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_jaxstruct_generated", False):
            init = generate_init_for_signature(cls) if init is not None else cls.__init__
        sig = inspect.signature(init)
        params = [
            p.replace(annotation=resolve_hint(cls, p.annotation))
            for p in list(sig.parameters.values())[1:]
        ]
        return sig.replace(parameters=params)

    def __setattr__(cls, name: str, value: Any) -> None:
        if name in _DATACLASS_ATTRIBUTES and "__struct_layout__" in cls.__dict__:
            # dataclasses.dataclass(cls) sets these first, before changing anything else.
            raise _decorated_struct_error(cls)
        type.__setattr__(cls, name, value)
        if name in _HOOK_NAMES:
            _hooks_changed(cls)

    def __delattr__(cls, name: str) -> None:
        type.__delattr__(cls, name)
        if name in _HOOK_NAMES:
            _hooks_changed(cls)


#: What ``dataclasses.dataclass`` sets on a class it processes (struct classes
#: answer both through descriptors of ``Struct``).
_DATACLASS_ATTRIBUTES = frozenset({"__dataclass_params__", "__dataclass_fields__"})


def _decorated_struct_error(cls: type) -> StructDefinitionError:
    bases = ", ".join(
        f"{b.__module__}.{b.__qualname__}" for b in cls.__bases__ if isinstance(b, StructMeta)
    )
    return StructDefinitionError(
        f"{cls.__module__}.{cls.__qualname__}: a dataclass decorator was applied to a struct "
        f"class (a subclass of {bases}). Struct classes are frozen dataclasses already, with "
        "their fields, defaults and dataclasses.field(...) declarations taken from the class "
        "body (metadata {'pytree_node': False} or {'static': True} makes a field static): "
        "drop the decorator. flax.struct.dataclass and jaxstruct.core.dataclass leave a "
        "struct class as it is, so code that must keep one of those may."
    )


#: Class attributes whose later assignment changes how instances are built.
_HOOK_NAMES = frozenset({"__post_init__", "__check_init__"})


def _hooks_changed(cls: type) -> None:
    """Re-read the lifecycle hooks of ``cls`` and its subclasses after one was patched.

    A class without hooks is built by a compiled ``__init__`` and ``replace``
    that skip the lifecycle; those are dropped (back to the stubs) so the next
    call compiles them again with the hooks. Construction stays as fast as
    ever for classes nobody patches.
    """
    pending = [cls]
    seen: set[type] = set()
    while pending:
        klass = pending.pop()
        if klass in seen:
            continue
        seen.add(klass)
        pending.extend(klass.__subclasses__())
        layout = klass.__dict__.get("__struct_layout__")
        if layout is None:
            continue
        layout.refresh_hooks()
        current = klass.__dict__.get("__init__")
        if layout.init_fn is not None:
            if current is layout.init_fn:
                type.__setattr__(klass, "__init__", lazy_init(klass))
            layout.init_fn = None
        replace = klass.__dict__.get("replace")
        if getattr(replace, "_jaxstruct_fast_replace", False):
            type.__delattr__(klass, "replace")


_DATACLASS_ONLY = {
    "eq": "== and hash() are always by field value (arrays by value); define __eq__ and "
    "__hash__ in the class body to change them",
    "order": "structs hold arrays, which have no total order; define __lt__ and the others "
    "in the class body (functools.total_ordering helps)",
    "unsafe_hash": "hash() is always by field value and raises a TypeError naming an "
    "unhashable field; nothing to switch on",
    "repr": "define __repr__ in the class body to replace the generated one",
    "slots": "jaxstruct lays out instance attributes itself (see the performance page); "
    "__slots__ would make flattening slower, not faster",
    "weakref_slot": "struct instances already support weak references",
}


def _check_class_keywords(qual: str, kwargs: dict[str, Any], frozen: bool) -> None:
    if not frozen:
        raise _fail(
            qual,
            "frozen=False is not supported: struct instances are always frozen, because JAX "
            "treats them as values; derive changed copies with .replace(...), or keep "
            "mutable state in an opaque field (field(pytree=False))",
        )
    for key in kwargs:
        reason = _DATACLASS_ONLY.get(key)
        if reason:
            raise _fail(
                qual,
                f"the class keyword {key}= is a dataclasses option that structs do not take: "
                f"{reason}. Struct classes take init=, kw_only=, match_args=, frozen=True "
                "and overwrite_parent_init=",
            )


_KW_ONLY = dataclasses.KW_ONLY


def _head(annotation: str) -> str:
    return annotation.replace(" ", "").split("[", 1)[0].rpartition(".")[2]


def is_initvar(annotation: Any) -> bool:
    """Whether an annotation is ``dataclasses.InitVar[...]`` (an argument, not a field)."""
    if isinstance(annotation, str):
        return _head(annotation) == "InitVar"
    return isinstance(annotation, dataclasses.InitVar) or annotation is dataclasses.InitVar


def _is_kw_only_marker(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return _head(annotation) == "KW_ONLY"
    return annotation is dataclasses.KW_ONLY


def _initvar_spec(qual: str, fname: str, value: Any) -> FieldSpec:
    if isinstance(value, FieldSpec):
        if value.derived is not None or value.converter is not None or value.validators:
            raise _fail(
                qual,
                f"InitVar {fname!r} is an argument of __init__ and __post_init__, not a field: "
                "it takes a default and nothing else; convert or check it in __post_init__",
            )
        spec = value._copy()
    else:
        spec = FieldSpec(default=value)
    spec.initvar = True
    return spec


def _collect_own_fields(
    qual: str, ns: dict[str, Any], inherited: dict[str, FieldSpec], *, kw_only: bool = False
) -> list[FieldSpec]:
    own: list[FieldSpec] = []
    annotations = _own_annotations(ns)
    for fname, annotation in annotations.items():
        if _is_classvar(annotation):
            continue
        # Plain classes (the common case) are neither InitVar nor KW_ONLY markers.
        plain = type(annotation) is type and annotation is not _KW_ONLY
        if not plain and _is_kw_only_marker(annotation):
            # ``_: KW_ONLY``: the fields after it are keyword-only (as in dataclasses).
            ns.pop(fname, None)
            kw_only = True
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
        if isinstance(value, dataclasses.Field):
            # The stdlib spelling (flax.struct.field and equinox.field return one too).
            value = from_dataclasses_field(value)
        if not plain and is_initvar(annotation):
            spec = _initvar_spec(qual, fname, value)
        elif isinstance(value, FieldSpec):
            spec = value._copy()
        else:
            spec = FieldSpec(default=value)
        if kw_only:
            spec.kw_only = True
        spec.name = fname
        spec.type = annotation
        if not plain:
            _add_annotation_constraints(spec, annotation, ns)
        for problem in spec._problems:
            raise _fail(qual, f"field {fname!r}: {problem}")
        if fname in inherited and not spec.override:
            problem = _redeclaration_problem(inherited[fname], spec)
            if problem is not None:
                module = ns.get("__module__")
                raise StructDefinitionError(
                    _redeclaration_message(
                        f"{module}.{qual}" if module else qual, inherited[fname], spec, problem
                    )
                )
        if spec.override and fname not in inherited:
            raise _fail(
                qual, f"field {fname!r} has override=True but no parent declares it; drop override"
            )
        own.append(spec)
    for attr, value in list(ns.items()):
        if isinstance(value, (FieldSpec, dataclasses.Field)):
            raise _fail(
                qual,
                f"{attr!r} is assigned field(...) but has no type annotation; annotate it "
                f"({attr}: int = field(...)) or remove the field() call",
            )
        if attr in inherited and attr not in annotations and not attr.startswith("__"):
            raise _fail(
                qual,
                f"class attribute {attr!r} silently shadows the inherited field {attr!r}; "
                f"to change its default redeclare it with its annotation ({attr}: <type> = "
                "<default>, the same kind of field; field(..., override=True) to change its "
                "kind or checks), or rename the attribute",
            )
    return own


def _add_annotation_constraints(spec: FieldSpec, annotation: Any, ns: dict[str, Any]) -> None:
    """Append the constraints written as ``Annotated`` metadata to the field's validators."""
    found = annotation_constraints(annotation, ns)
    if found:
        spec.validators = (*spec.declared_validators, *found)
        spec.annotated = found


def _redeclaration_problem(parent: FieldSpec, spec: FieldSpec) -> str | None:
    """What a redeclaration without ``override=True`` changes that needs it, or ``None``.

    Changing the default (or the annotation, ``init``, ``repr``, ...) is how
    dataclasses, flax.struct and equinox code adapts an inherited field, and is
    accepted. Changing the kind of field, or dropping a converter or validator,
    is the mistake worth stopping.
    """
    if spec.initvar != parent.initvar:
        was, now = ("an InitVar", "a field") if parent.initvar else ("a field", "an InitVar")
        return f"it turns {was} into {now}"
    if spec.kind is not parent.kind:
        return f"it turns {_KIND_WORDS[parent.kind]} into {_KIND_WORDS[spec.kind]}"
    if parent.converter is not None and spec.converter is not parent.converter:
        verb = "drops" if spec.converter is None else "replaces"
        return f"it {verb} the parent's converter"
    if any(v not in spec.declared_validators for v in parent.declared_validators):
        return "it drops the parent's validator(s)"
    if spec.derived is not parent.derived:
        return "it changes how the field is derived"
    return None


_KIND_WORDS = {
    FieldKind.NODE: "a node field",
    FieldKind.STATIC: "a static field",
    FieldKind.OPAQUE: "an opaque field",
}
_KIND_FLAG = {
    FieldKind.NODE: "",
    FieldKind.STATIC: "static=True, ",
    FieldKind.OPAQUE: "pytree=False, ",
}


def _hook_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _redeclaration_message(cls_name: str, parent: FieldSpec, spec: FieldSpec, problem: str) -> str:
    owner = parent.owner
    pname = f"{owner.__module__}.{owner.__qualname__}" if owner is not None else "a parent"
    keep = _KIND_FLAG[parent.kind] + "default=..."
    if parent.converter is not None:
        keep += f", converter={_hook_name(parent.converter)}"
    declared = parent.declared_validators
    if declared:
        names = ", ".join(_hook_name(v) for v in declared)
        keep += f", validator={names if len(declared) == 1 else f'[{names}]'}"
    replace = _KIND_FLAG[spec.kind] + "default=..."
    if spec.converter is not None:
        replace += ", converter=..."
    name = spec.name
    return (
        f"{cls_name}: field {name!r} redeclares the field inherited from {pname}, and {problem}. "
        "A redeclaration may change the default (as in dataclasses, flax.struct and equinox) "
        "but keeps the kind of field (node, static or opaque), the converter and the "
        "validators; a change to those is more often a typo or a copy-paste than meant. "
        f"To change only the default, keep what {owner.__qualname__ if owner else 'it'} "
        f"declares:\n\n    {name}: ... = field({keep})\n\n"
        f"to replace the field deliberately, say so with override=True:\n\n"
        f"    {name}: ... = field({replace}, override=True)\n\n"
        f"or drop the annotation to inherit {name!r} unchanged."
    )


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


def _make_parent_init_cooperative(cls: type) -> None:
    """Let ``super().__init__()`` in ``cls``'s own ``__init__`` reach a generated one bare."""
    klass, init = _first_init(cls)
    if (
        "__struct_layout__" in klass.__dict__
        and getattr(init, "_jaxstruct_generated", False)
        and not getattr(init, "_jaxstruct_cooperative", False)
    ):
        type.__setattr__(klass, "__init__", cooperative_init(klass))


def _first_init(cls: type) -> tuple[type, Any]:
    for klass in cls.__mro__[1:]:
        init = klass.__dict__.get("__init__")
        if init is not None:
            return klass, init
    return object, object.__init__


def _check_parent_init(cls: type, qual: str, overwrite: bool, klass: type, init: Any) -> None:
    if overwrite or init is object.__init__ or getattr(init, "_jaxstruct_generated", False):
        return
    parent = name_classes(cls, klass)[1]
    raise _fail(
        qual,
        f"the __init__ inherited from {parent} is custom and a generated one would "
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
