"""Lazily generated functions, specialised per class: ``__init__``, unflatten,
``replace`` and the builder of the flattened form.

Compiling Python source costs tens of microseconds, more than creating a whole
class should. So a class starts with small stubs (or none), and the first use
compiles the specialised function and puts it in place: ``__init__`` and
``replace`` by setting the class attribute, unflatten (whose function object
JAX already holds) by swapping the stub's ``__code__``. Generated code reads
every helper from locals (closure cells, or positional defaults for unflatten,
which JAX calls with exactly two arguments), never from globals.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import types
from typing import Any

from ._fields import MISSING
from ._layout import FLAT, Layout, Opaque, converter_failed
from ._lifecycle import BUILDING, SAFE_STATIC_TYPES, assign_arguments, check_static, finish

__all__ = [
    "FACTORY",
    "LazyAnnotations",
    "LazySignature",
    "generate_flat",
    "generate_init",
    "generate_replace",
    "lazy_init",
    "lazy_unflatten",
    "set_generic_replace",
]

_osa = object.__setattr__
_new = object.__new__
_new_signature = inspect.Signature.__new__

#: Whether generated code stores fields straight into the instance ``__dict__``
#: (CPython 3.13 and later) rather than with ``object.__setattr__`` (3.11, 3.12).
#: A frozen class overrides ``__setattr__``, which turns off the interpreter's
#: specialised attribute stores, so each field costs an ``object.__setattr__``
#: call. A dict store (``d[name] = value``) is several times cheaper, but on
#: 3.11 and 3.12 asking for ``__dict__`` moves the attributes out of the
#: instance's inline array into a real dict, and every later read of them gets
#: about 3.5x slower. From 3.13 on the dict is built on top of the inline array
#: (measured: reads unchanged), so there it is the faster store. Read when each
#: function is generated (tests switch it to compare both).
STORE_IN_DICT = sys.version_info >= (3, 13)


def stores_in_dict(cls: type, layout: Layout) -> bool:
    """Whether code generated for ``cls`` now stores fields through the instance ``__dict__``.

    Not when a class in the MRO has a data descriptor (a property, a slot) named
    like a field or a cached form: ``object.__setattr__`` would run its
    ``__set__``, a dict store would hide the value behind it.
    """
    if not STORE_IN_DICT:
        return False
    names = (*(spec.name for spec in layout.fields), FLAT)
    for klass in cls.__mro__:
        for name in names:
            attr = klass.__dict__.get(name)
            if attr is not None and hasattr(type(attr), "__set__"):
                return False
    return True


def _store(target: str, name: str, value: str, *, in_dict: bool) -> str:
    """The statement storing ``value`` as attribute ``name`` of instance ``target``.

    With ``in_dict``, ``target`` names the instance's ``__dict__`` instead.
    """
    if in_dict:
        return f"{target}[{name!r}] = {value}"
    return f"_js_osa({target}, {name!r}, {value})"


class _Factory:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


FACTORY: Any = _Factory()


def lazy_init(cls: type) -> Any:
    """Return the stub ``__init__`` for ``cls``; its first call installs the real one.

    The stub's signature (``inspect.signature``, what jaxtyping's ``@jaxtyped``
    reads) is the real constructor's, worked out only when asked for.
    """

    def __init__(self: Any, /, *args: Any, **kwargs: Any) -> None:
        real = cls.__dict__["__struct_layout__"].init_fn or generate_init(cls)
        real(self, *args, **kwargs)

    return _as_generated(__init__, cls)


def cooperative_init(cls: type) -> Any:
    """Return an ``__init__`` for ``cls`` that a subclass's own ``__init__`` may call bare.

    Installed on a struct class with a generated constructor once a subclass
    writes its own ``__init__``. ``super().__init__()`` from there (the
    cooperative pattern of mixins) assigns the arguments it is given and keeps
    what the subclass already assigned, where the compiled constructor would
    demand every required field again. Instances of ``cls`` itself still go
    through the compiled constructor, so only classes with such subclasses pay
    the extra call.
    """

    def __init__(self: Any, /, *args: Any, **kwargs: Any) -> None:
        layout: Layout = cls.__dict__["__struct_layout__"]
        if id(self) in BUILDING:
            assign_arguments(self, layout, args, kwargs, keep_assigned=True)
            return
        (layout.init_fn or generate_init(cls))(self, *args, **kwargs)

    __init__._jaxstruct_cooperative = True  # type: ignore[attr-defined]
    return _as_generated(__init__, cls)


def _as_generated(fn: Any, cls: type) -> Any:
    fn.__qualname__ = f"{cls.__qualname__}.__init__"
    fn.__module__ = cls.__module__
    fn._jaxstruct_generated = True
    fn.__annotations__ = LazyAnnotations(cls)
    signature = _new_signature(LazySignature)
    signature._js_cls = cls
    fn.__signature__ = signature
    return fn


def _is_stub(fn: Any) -> bool:
    # Every stub shares one code object; a wrapper of a stub (jaxtyping's) does not.
    return getattr(fn, "__code__", None) is _STUB_CODE


def generate_init(cls: type) -> Any:
    """Compile the specialised ``__init__`` of ``cls`` once, and install it if the stub is there.

    When something else wrapped the stub meanwhile (a decorator on the class
    such as jaxtyping's ``@jaxtyped``), the wrapper stays and calls the
    compiled function through the stub.
    """
    layout: Layout = cls.__dict__["__struct_layout__"]
    init = layout.init_fn
    if init is None:
        init = _compile_init(cls, layout)
        layout.init_fn = init
    if _is_stub(cls.__dict__.get("__init__")):
        type.__setattr__(cls, "__init__", init)
    return init


def _compile_init(cls: type, layout: Layout) -> Any:
    resolved = layout.resolve()
    env: dict[str, Any] = {
        "_js_osa": _osa,
        "_js_type": type,
        "_js_FACTORY": FACTORY,
        "_js_SAFE": SAFE_STATIC_TYPES,
        "_js_check": check_static,
        "_js_finish": finish,
        "_js_failed": converter_failed,
        "_js_layout": layout,
        "_js_cls": cls,
    }
    params: list[str] = []
    kwonly: list[str] = []
    body: list[str] = []
    for spec in layout.init_params:
        name = spec.name
        if spec.default is not MISSING:
            env[f"_js_d_{name}"] = spec.default
            param = f"{name}=_js_d_{name}"
        elif spec.default_factory is not MISSING:
            env[f"_js_f_{name}"] = spec.default_factory
            param = f"{name}=_js_FACTORY"
            body.append(f"    if {name} is _js_FACTORY: {name} = _js_f_{name}()")
        else:
            param = name
        (kwonly if spec.kw_only else params).append(param)
    checked = () if layout.has_hooks else layout.static_checked
    in_dict = stores_in_dict(cls, layout)
    target = "_js_self"
    if in_dict and any(spec.derived is None for spec in layout.fields):
        body.append("    _js_d = _js_self.__dict__")
        target = "_js_d"
    for spec in layout.fields:
        name = spec.name
        if spec.derived is not None:
            continue
        if spec.init:
            value = name
        elif spec.default is not MISSING:
            env[f"_js_d_{name}"] = spec.default
            value = f"_js_d_{name}"
        elif spec.default_factory is not MISSING:
            env[f"_js_f_{name}"] = spec.default_factory
            value = f"_js_f_{name}()"
        else:
            continue  # left for __post_init__ to assign; checked in finish()
        if spec.converter is not None:
            env[f"_js_c_{name}"] = spec.converter
            first = "_js_self, " if resolved["converters"][name] else ""
            # try costs nothing until something raises (Python 3.11+).
            body += [
                "    try:",
                f"        {name} = _js_c_{name}({first}{value})",
                "    except Exception as _js_e:",
                f"        _js_failed(_js_cls, {name!r}, _js_c_{name}, _js_e)",
            ]
        elif value != name:
            body.append(f"    {name} = {value}")
        if name in checked:
            # Static values are checked before any field is set (the checks
            # read locals, not attributes); int, str, ... skip the call.
            body.append(f"    {_static_check(spec, env)}")
        body.append(f"    {_store(target, name, name, in_dict=in_dict)}")
    if layout.initvars:
        values = "".join(f"{spec.name}, " for spec in layout.initvars)
        body.append(f"    _js_finish(_js_self, _js_layout, initvars=({values}))")
    elif layout.has_hooks:
        body.append("    _js_finish(_js_self, _js_layout)")
    # The flattened form is built on the first flatten (see _cache): storing it
    # here would cost every construction 10-20% (measured), flattened or not.
    if not body:
        body.append("    pass")
    signature = ", ".join(["_js_self", *params, *(["*", *kwonly] if kwonly else [])])
    if not any(spec.name == "self" for spec in layout.init_params):
        # The instance parameter is called self, as in every other __init__
        # (inspect.signature shows it), unless a field takes that name.
        signature = _SELF.sub("self", signature)
        body = [_SELF.sub("self", line) for line in body]
    init = _compile(cls, "__init__", signature, body, env)
    init.__doc__ = f"Create a {cls.__name__} from its fields."
    init.__annotations__ = init_annotations(cls)
    init._jaxstruct_generated = True
    init._jaxstruct_compiled = True
    return init


_SELF = re.compile(r"\b_js_self\b")


def init_annotations(cls: type) -> dict[str, Any]:
    """The ``__annotations__`` of the constructor of ``cls``: one per parameter, and ``return``.

    Resolved (string annotations evaluated in the class's module, once per
    class): tools reading them (jaxtyping, ``typing.get_type_hints``) cannot
    see that module from a generated function.
    """
    layout: Layout = cls.__dict__["__struct_layout__"]
    resolved = layout.resolve()
    return {
        **{
            spec.name: converter_input(spec.converter, resolved["converters"][spec.name])
            if spec.converter is not None
            else resolve_hint(cls, init_annotation(spec))
            for spec in layout.init_params
        },
        "return": None,
    }


class LazyAnnotations(dict[str, Any]):
    """The ``__annotations__`` of a stub ``__init__``: the real constructor's, filled on first use.

    A class is defined without compiling or resolving anything; whoever reads
    the annotations of its ``__init__`` before the first instance exists
    (``typing.get_type_hints``, ``inspect.get_annotations``, ``functools.wraps``
    then a read) sees the real parameters all the same. Every reading or
    writing method fills the dict first.
    """

    __slots__ = ("_js_cls",)

    def __init__(self, cls: type) -> None:
        super().__init__()
        self._js_cls: type | None = cls

    def _js_fill(self) -> None:
        cls = self._js_cls
        if cls is not None:
            self._js_cls = None
            dict.update(self, init_annotations(cls))


def _filling(name: str) -> Any:
    method = getattr(dict, name)

    def call(self: LazyAnnotations, /, *args: Any, **kwargs: Any) -> Any:
        self._js_fill()
        return method(self, *args, **kwargs)

    call.__name__ = name
    call.__qualname__ = f"LazyAnnotations.{name}"
    return call


for _name in (
    "__contains__",
    "__delitem__",
    "__eq__",
    "__getitem__",
    "__ior__",
    "__iter__",
    "__len__",
    "__ne__",
    "__or__",
    "__repr__",
    "__reversed__",
    "__ror__",
    "__setitem__",
    "clear",
    "copy",
    "get",
    "items",
    "keys",
    "pop",
    "popitem",
    "setdefault",
    "update",
    "values",
):
    setattr(LazyAnnotations, _name, _filling(_name))
LazyAnnotations.__hash__ = None  # type: ignore[assignment]  # a dict, unhashable


def init_annotation(spec: Any) -> Any:
    """The annotation a constructor parameter shows: the field's, or an InitVar's inner type."""
    hint = spec.type
    if isinstance(hint, dataclasses.InitVar):
        return hint.type
    return hint


def converter_input(converter: Any, takes_self: bool) -> Any:
    """The type a converter accepts: the annotation of its value parameter, or ``Any``.

    This is what the constructor's parameter for a converted field is annotated
    with (as equinox does, and as type checkers read a field specifier's
    ``converter``), so ``inspect.signature`` and tools built on it accept
    anything the converter takes. The value parameter is the first one, or the
    second for a converter that also takes the instance; a string annotation is
    evaluated in the converter's module when it can be. A converter without a
    signature (``int``, ``str``) or without an annotation gives ``Any``.
    """
    try:
        params = list(inspect.signature(converter).parameters.values())
    except (TypeError, ValueError):
        return Any
    index = 1 if takes_self else 0
    if len(params) <= index or params[index].kind in (
        inspect.Parameter.VAR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    ):
        return Any
    hint = params[index].annotation
    if hint is inspect.Parameter.empty:
        return Any
    if isinstance(hint, str):
        scope = getattr(inspect.unwrap(converter), "__globals__", None)
        try:
            return eval(hint, dict(scope or {}))
        except Exception:
            return hint
    return hint


class LazySignature(inspect.Signature):
    """The constructor signature of a struct class, computed on first use.

    A stub ``__init__`` carries one, so defining a class compiles nothing, while
    ``inspect.signature`` (and tools built on it) see the real parameters and
    annotations, with string annotations resolved where possible.
    """

    __slots__ = ("_js_cls",)
    _js_cls: type | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._js_cls = None
        super().__init__(*args, **kwargs)

    def _js_load(self) -> None:
        owner = self._js_cls
        if owner is None:
            return
        self._js_cls = None
        real = inspect.signature(generate_init_for_signature(owner))
        params = [
            p.replace(annotation=resolve_hint(owner, p.annotation))
            for p in real.parameters.values()
        ]
        inspect.Signature.__init__(self, params, return_annotation=real.return_annotation)

    @property
    def parameters(self) -> Any:  # type: ignore[override]
        self._js_load()
        return inspect.Signature.parameters.fget(self)  # type: ignore[attr-defined]

    @property
    def return_annotation(self) -> Any:  # type: ignore[override]
        self._js_load()
        return inspect.Signature.return_annotation.fget(self)  # type: ignore[attr-defined]


def generate_init_for_signature(cls: type) -> Any:
    """The compiled constructor of ``cls`` (compiled now if needed), whoever calls it."""
    layout: Layout = cls.__dict__["__struct_layout__"]
    return layout.init_fn or generate_init(cls)


def resolve_hint(cls: type, hint: Any) -> Any:
    """Evaluate a string annotation in the module of ``cls``; leave it as is when that fails."""
    if not isinstance(hint, str):
        return hint
    module = sys.modules.get(cls.__module__)
    scope = dict(vars(module)) if module is not None else {}
    try:
        value = eval(hint, scope, dict(vars(cls)))
    except Exception:
        return hint
    if isinstance(value, dataclasses.InitVar):
        return value.type
    return value


_SAFE_BY_NAME = {t.__name__: t for t in SAFE_STATIC_TYPES}


def _static_check(spec: Any, env: dict[str, Any]) -> str:
    """The statement checking local ``spec.name`` as a static value.

    When the annotation names a type that needs no check (``int``, ``str``,
    ...), an identity test on that type comes first: the common case then
    costs one ``type()`` call and an ``is``.
    """
    name = spec.name
    check = f"_js_check(_js_cls, {name!r}, {name})"
    hint = spec.type if isinstance(spec.type, type) else _SAFE_BY_NAME.get(str(spec.type))
    if hint in SAFE_STATIC_TYPES:
        env[f"_js_t_{name}"] = hint
        return (
            f"if _js_type({name}) is not _js_t_{name} and _js_type({name}) not in _js_SAFE: {check}"
        )
    return f"if _js_type({name}) not in _js_SAFE: {check}"


def _pair_source(layout: Layout, env: dict[str, Any]) -> str:
    """Source of the ``(children, aux)`` expression over the fields of ``_js_self``."""
    children = "".join(f"_js_self.{n}, " for n in layout.node_names)
    aux = "".join(f"_js_self.{n}, " for n in layout.static_names)
    if layout.opaque_names:
        env["_js_Opaque"] = Opaque
        opaque = "".join(f"_js_self.{n}, " for n in layout.opaque_names)
        aux += f"_js_Opaque(({opaque})), "
    return f"(({children}), ({aux}))"


def _compile(cls: type, name: str, signature: str, body: list[str], env: dict[str, Any]) -> Any:
    """Compile ``def name(signature): body`` with ``env``'s entries as closure cells."""
    source = (
        f"def _js_make({', '.join(env)}):\n"
        f"  def {name}({signature}):\n"
        + "\n".join("  " + line for line in body)
        + f"\n  return {name}\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<jaxstruct {cls.__qualname__}.{name}>", "exec"), namespace)
    fn = namespace["_js_make"](**env)
    fn.__qualname__ = f"{cls.__qualname__}.{name}"
    fn.__module__ = cls.__module__
    return fn


def generate_flat(layout: Layout) -> Any:
    """Compile ``obj -> (children, aux)`` for the class of ``layout`` and keep it there.

    The function also stores the pair on the instance (what flatten reads from
    then on), unless the instance is still being built and may change.
    """
    env: dict[str, Any] = {"_js_osa": _osa, "_js_id": id, "_js_building": BUILDING}
    body = [
        f"    _js_pair = {_pair_source(layout, env)}",
        "    if _js_id(_js_self) not in _js_building:",
        f"        _js_osa(_js_self, {FLAT!r}, _js_pair)",
        "    return _js_pair",
    ]
    fn = _compile(layout.cls, "flat_of", "_js_self", body, env)
    layout.flat_of = fn
    return fn


def _stub_unflatten(
    _js_aux: Any, _js_children: Any, _js_cls: Any = None, _js_new: Any = None, _js_osa: Any = None
) -> Any:
    layout: Layout = _js_cls.__dict__["__struct_layout__"]
    fast = _generate_unflatten(_js_cls)
    # One assignment swaps the code: both take the same defaults.
    layout.unflatten.__code__ = fast.__code__
    return fast(_js_aux, _js_children)


def lazy_unflatten(cls: type) -> Any:
    """Return the unflatten function to register with JAX for ``cls``.

    It never calls ``__init__``: fields are set straight from the children and
    aux data, so converters, validators, ``__post_init__`` and derived
    callables do not run and any leaf (tracer, ``None``, sentinel) is accepted.
    """
    fn = types.FunctionType(
        _stub_unflatten.__code__, _stub_unflatten.__globals__, "unflatten", None, None
    )
    # Helpers are positional defaults (JAX passes exactly two arguments):
    # filling those is cheaper than keyword-only defaults or closure cells.
    fn.__defaults__ = (cls, _new, _osa)
    cls.__dict__["__struct_layout__"].unflatten = fn
    fn.__qualname__ = f"{cls.__qualname__}.unflatten"
    return fn


def _generate_unflatten(cls: type) -> Any:
    layout: Layout = cls.__dict__["__struct_layout__"]
    in_dict = stores_in_dict(cls, layout)
    target = "_js_d" if in_dict else "_js_self"
    lines = ["    _js_self = _js_new(_js_cls)"]
    if in_dict:
        lines.append("    _js_d = _js_self.__dict__")
    if layout.node_names:
        targets = ", ".join(f"_js_n{i}" for i in range(len(layout.node_names)))
        lines.append(f"    {targets}, = _js_children")
        lines += [
            f"    {_store(target, name, f'_js_n{i}', in_dict=in_dict)}"
            for i, name in enumerate(layout.node_names)
        ]
    aux_targets = [f"_js_a{i}" for i in range(len(layout.static_names))]
    if layout.opaque_names:
        aux_targets.append("_js_opaque")
    if aux_targets:
        lines.append(f"    {', '.join(aux_targets)}, = _js_aux")
        lines += [
            f"    {_store(target, name, f'_js_a{i}', in_dict=in_dict)}"
            for i, name in enumerate(layout.static_names)
        ]
    if layout.opaque_names:
        targets = ", ".join(f"_js_o{i}" for i in range(len(layout.opaque_names)))
        lines.append(f"    {targets}, = _js_opaque.values")
        lines += [
            f"    {_store(target, name, f'_js_o{i}', in_dict=in_dict)}"
            for i, name in enumerate(layout.opaque_names)
        ]
    lines.append(f"    {_store(target, FLAT, '(_js_children, _js_aux)', in_dict=in_dict)}")
    lines.append("    return _js_self")
    source = (
        "def unflatten(_js_aux, _js_children, _js_cls, _js_new, _js_osa):\n"
        + "\n".join(lines)
        + "\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<jaxstruct {cls.__qualname__}.unflatten>", "exec"), namespace)
    fast = namespace["unflatten"]
    fast.__defaults__ = (cls, _new, _osa)  # the same as the stub's
    return fast


def generate_replace(cls: type) -> Any:
    """Compile and install ``replace`` for a class without lifecycle hooks.

    The generated method takes every field as an optional keyword argument:
    unchanged fields are copied as they are; changed ones are converted and,
    if static, checked. Anything unusual (an unknown name, an instance of a
    subclass) goes to ``Struct.replace``, the general path.
    """
    layout: Layout = cls.__dict__["__struct_layout__"]
    current = cls.__dict__.get("replace")
    if current is not None and getattr(current, "_jaxstruct_fast_replace", False):
        return current
    resolved = layout.resolve()
    env: dict[str, Any] = {
        "_js_osa": _osa,
        "_js_new": _new,
        "_js_type": type,
        "_js_cls": cls,
        "_js_M": MISSING,
        "_js_SAFE": SAFE_STATIC_TYPES,
        "_js_check": check_static,
        "_js_slow": _slow_replace,
    }
    names = [f.name for f in layout.fields]
    env["_js_names"] = tuple(names)
    values = "".join(f"{n}, " for n in names)
    body = [
        "    if _js_more or _js_type(_js_self) is not _js_cls:",
        f"        return _js_slow(_js_self, _js_names, ({values}), _js_more)",
        "    _js_n = _js_new(_js_cls)",
    ]
    in_dict = stores_in_dict(cls, layout)
    target = "_js_n"
    if in_dict and names:
        body.append("    _js_d = _js_n.__dict__")
        target = "_js_d"
    checked = set(layout.static_checked)
    for spec in layout.fields:
        name = spec.name
        body.append(f"    if {name} is _js_M: {name} = _js_self.{name}")
        changed: list[str] = []
        if spec.converter is not None:
            env[f"_js_c_{name}"] = spec.converter
            env["_js_failed"] = converter_failed
            first = "_js_n, " if resolved["converters"][name] else ""
            changed += [
                "try:",
                f"    {name} = _js_c_{name}({first}{name})",
                "except Exception as _js_e:",
                f"    _js_failed(_js_cls, {name!r}, _js_c_{name}, _js_e)",
            ]
        if name in checked:
            changed.append(_static_check(spec, env))
        if changed:
            body.append("    else:")
            body += [f"        {line}" for line in changed]
        body.append(f"    {_store(target, name, name, in_dict=in_dict)}")
    body.append("    return _js_n")
    keywords = ["*", *(f"{n}=_js_M" for n in names)] if names else []
    signature = ", ".join(["_js_self", "/", *keywords, "**_js_more"])
    fn = _compile(cls, "replace", signature, body, env)
    fn.__doc__ = _replace_doc
    fn.__signature__ = inspect.Signature(
        [
            inspect.Parameter(
                "_js_self" if "self" in names else "self", inspect.Parameter.POSITIONAL_ONLY
            ),
            *(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=_KEEP) for n in names),
        ]
    )
    fn._jaxstruct_fast_replace = True
    type.__setattr__(cls, "replace", fn)
    return fn


class _Keep:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<unchanged>"


_KEEP = _Keep()  # what the signature of a generated replace shows as each default
_replace_doc: str | None = None
_generic_replace: Any = None


def set_generic_replace(fn: Any) -> None:
    """Tell the generated ``replace`` methods where the general path is (``Struct.replace``)."""
    global _generic_replace, _replace_doc
    _generic_replace = fn
    _replace_doc = fn.__doc__


def _slow_replace(
    obj: Any, names: tuple[str, ...], values: tuple[Any, ...], more: dict[str, Any]
) -> Any:
    changes = {n: v for n, v in zip(names, values, strict=True) if v is not MISSING}
    changes.update(more)
    return _generic_replace(obj, **changes)


_STUB_CODE = lazy_init(type("_Probe", (), {})).__code__
