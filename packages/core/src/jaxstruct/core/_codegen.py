"""Lazily generated ``__init__`` and unflatten functions, specialised per class.

Compiling Python source costs tens of microseconds, more than creating a whole
class should. So a class starts with small stubs, and the first call compiles
the specialised function and puts it in place: ``__init__`` by replacing the
class attribute, unflatten (whose function object JAX already holds) by
swapping the stub's ``__code__``. Generated code reads every helper from
locals (closure cells or keyword-only defaults), never from globals.
"""

from __future__ import annotations

import types
from typing import Any

from ._fields import MISSING
from ._layout import FLAT, Layout, Opaque
from ._lifecycle import SAFE_STATIC_TYPES, check_static, finish

__all__ = ["FACTORY", "generate_init", "generate_replace", "lazy_init", "lazy_unflatten"]

_osa = object.__setattr__
_new = object.__new__


class _Factory:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


FACTORY: Any = _Factory()


def lazy_init(cls: type) -> Any:
    """Return the stub ``__init__`` for ``cls``; its first call installs the real one."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        real = generate_init(cls)
        real(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    __init__._jaxstruct_generated = True  # type: ignore[attr-defined]
    return __init__


def generate_init(cls: type) -> Any:
    """Compile and install the specialised ``__init__`` of ``cls`` (idempotent)."""
    current = cls.__dict__.get("__init__")
    if current is not None and getattr(current, "_jaxstruct_compiled", False):
        return current
    layout: Layout = cls.__dict__["__struct_layout__"]
    resolved = layout.resolve()
    env: dict[str, Any] = {
        "_js_osa": _osa,
        "_js_FACTORY": FACTORY,
        "_js_SAFE": SAFE_STATIC_TYPES,
        "_js_check": check_static,
        "_js_finish": finish,
        "_js_layout": layout,
        "_js_cls": cls,
    }
    params: list[str] = []
    kwonly: list[str] = []
    body: list[str] = []
    for spec in layout.init_fields:
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
            if resolved["converters"][name]:
                value = f"_js_c_{name}(_js_self, {value})"
            else:
                value = f"_js_c_{name}({value})"
        body.append(f"    _js_osa(_js_self, {name!r}, {value})")
    if layout.has_hooks:
        body.append("    _js_finish(_js_self, _js_layout)")
    else:
        for name in layout.static_checked:
            body.append(
                f"    if type(_js_self.{name}) not in _js_SAFE: "
                f"_js_check(_js_cls, {name!r}, _js_self.{name})"
            )
        # The flattened form read by the C-level flatten (see set_caches).
        children = "".join(f"_js_self.{n}, " for n in layout.node_names)
        aux = "".join(f"_js_self.{n}, " for n in layout.static_names)
        if layout.opaque_names:
            env["_js_Opaque"] = Opaque
            opaque = "".join(f"_js_self.{n}, " for n in layout.opaque_names)
            aux += f"_js_Opaque(({opaque})), "
        body.append(f"    _js_osa(_js_self, {FLAT!r}, (({children}), ({aux})))")
    if not body:
        body.append("    pass")
    signature = ", ".join(["_js_self", *params, *(["*", *kwonly] if kwonly else [])])
    names = ", ".join(env)
    source = (
        f"def _js_make({names}):\n"
        f"  def __init__({signature}):\n"
        + "\n".join("  " + line for line in body)
        + "\n  return __init__\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<jaxstruct {cls.__qualname__}.__init__>", "exec"), namespace)
    init = namespace["_js_make"](**env)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = f"Create a {cls.__name__} from its fields."
    init._jaxstruct_generated = True
    init._jaxstruct_compiled = True
    type.__setattr__(cls, "__init__", init)
    return init


def _stub_unflatten(
    _js_aux: Any, _js_children: Any, *, _js_cls: Any = None, _js_fn: Any = None
) -> Any:
    fast = _generate_unflatten(_js_cls)
    _js_fn.__code__ = fast.__code__
    _js_fn.__kwdefaults__ = fast.__kwdefaults__
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
    fn.__kwdefaults__ = {"_js_cls": cls, "_js_fn": fn}
    fn.__qualname__ = f"{cls.__qualname__}.unflatten"
    return fn


def _generate_unflatten(cls: type) -> Any:
    layout: Layout = cls.__dict__["__struct_layout__"]
    lines = ["    _js_self = _js_new(_js_cls)"]
    if layout.node_names:
        targets = ", ".join(f"_js_n{i}" for i in range(len(layout.node_names)))
        lines.append(f"    {targets}, = _js_children")
        lines += [
            f"    _js_osa(_js_self, {name!r}, _js_n{i})" for i, name in enumerate(layout.node_names)
        ]
    aux_targets = [f"_js_a{i}" for i in range(len(layout.static_names))]
    if layout.opaque_names:
        aux_targets.append("_js_opaque")
    if aux_targets:
        lines.append(f"    {', '.join(aux_targets)}, = _js_aux")
        lines += [
            f"    _js_osa(_js_self, {name!r}, _js_a{i})"
            for i, name in enumerate(layout.static_names)
        ]
    if layout.opaque_names:
        targets = ", ".join(f"_js_o{i}" for i in range(len(layout.opaque_names)))
        lines.append(f"    {targets}, = _js_opaque.values")
        lines += [
            f"    _js_osa(_js_self, {name!r}, _js_o{i})"
            for i, name in enumerate(layout.opaque_names)
        ]
    lines.append(f"    _js_osa(_js_self, {FLAT!r}, (_js_children, _js_aux))")
    lines.append("    return _js_self")
    source = (
        "def unflatten(_js_aux, _js_children, *, _js_cls, _js_new, _js_osa):\n"
        + "\n".join(lines)
        + "\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<jaxstruct {cls.__qualname__}.unflatten>", "exec"), namespace)
    fast = namespace["unflatten"]
    fast.__kwdefaults__ = {"_js_cls": cls, "_js_new": _new, "_js_osa": _osa}
    return fast


def generate_replace(layout: Layout) -> Any:
    """Compile ``replace`` for a class without lifecycle hooks (converters are fine).

    Unchanged fields are copied as they are; changed ones are converted and, if
    static, checked; the flattened form is rebuilt from the new values.
    """
    cls = layout.cls
    resolved = layout.resolve()
    env: dict[str, Any] = {
        "_js_osa": _osa,
        "_js_new": _new,
        "_js_cls": cls,
        "_js_names": frozenset(layout.by_name),
        "_js_SAFE": SAFE_STATIC_TYPES,
        "_js_check": check_static,
        "_js_Opaque": Opaque,
    }
    body = [
        "    for _js_k in _js_changes:",
        "        if _js_k not in _js_names: return None",
        "    _js_n = _js_new(_js_cls)",
        "    _js_get = _js_changes.get",
    ]
    static_checked = set(layout.static_checked)
    for i, spec in enumerate(layout.fields):
        name = spec.name
        local = f"_js_v{i}"
        body.append(f"    {local} = _js_get({name!r}, _js_self.{name})")
        if spec.converter is not None:
            env[f"_js_c_{name}"] = spec.converter
            call = (
                f"_js_c_{name}(_js_n, {local})"
                if resolved["converters"][name]
                else f"_js_c_{name}({local})"
            )
            body.append(f"    if {name!r} in _js_changes: {local} = {call}")
        if name in static_checked:
            body.append(
                f"    if type({local}) not in _js_SAFE and {name!r} in _js_changes: "
                f"_js_check(_js_cls, {name!r}, {local})"
            )
        body.append(f"    _js_osa(_js_n, {name!r}, {local})")
    index = {spec.name: i for i, spec in enumerate(layout.fields)}
    children = "".join(f"_js_v{index[n]}, " for n in layout.node_names)
    aux = "".join(f"_js_v{index[n]}, " for n in layout.static_names)
    if layout.opaque_names:
        opaque = "".join(f"_js_v{index[n]}, " for n in layout.opaque_names)
        aux += f"_js_Opaque(({opaque})), "
    body.append(f"    _js_osa(_js_n, {FLAT!r}, (({children}), ({aux})))")
    body.append("    return _js_n")
    names = ", ".join(env)
    source = (
        f"def _js_make({names}):\n"
        "  def replace(_js_self, _js_changes):\n"
        + "\n".join("  " + line for line in body)
        + "\n  return replace\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<jaxstruct {cls.__qualname__}.replace>", "exec"), namespace)
    fast = namespace["_js_make"](**env)
    layout.fast_replace = fast
    return fast
