"""A mypy plugin that teaches mypy what struct classes do beyond ``dataclass_transform``.

Enable it in the mypy configuration::

    [tool.mypy]
    plugins = ["jaxstruct.core.mypy_plugin"]

With it, mypy

* types ``obj.replace(...)`` like the constructor with every argument optional and
  keyword-only: an unknown field name or a wrongly typed value is an error, and the
  result has the type of ``obj``;
* knows that a [`register_class`][jaxstruct.core.register_class] (or ``dataclass``)
  class is a [`Struct`][jaxstruct.core.Struct] (``.replace``, ``fields()``, ...);
* lets a constructor or ``replace`` argument of a field with a ``converter`` take what
  the converter takes (the type of its first parameter, or anything when that is not
  known), as the converter runs before the value is stored;
* does not count an ``AbstractVar`` declaration (``jaxstruct.abc``) as a field, so a
  subclass may provide it with a field, a property or a class attribute.

Pyright has no plugins. It reads converters itself, and from
``pythonVersion = "3.13"`` on it types ``replace`` from the ``__replace__`` it
synthesises for dataclass-like classes; the other two points cannot be expressed
to it (the docs' "Type checking" page says what to write instead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mypy.mro import MroError, calculate_mro
from mypy.nodes import (
    ARG_NAMED_OPT,
    ARG_POS,
    AssignmentStmt,
    CallExpr,
    Decorator,
    FuncDef,
    LambdaExpr,
    NameExpr,
    RefExpr,
    TempNode,
    TypeInfo,
    Var,
)
from mypy.plugin import (
    AttributeContext,
    ClassDefContext,
    FunctionSigContext,
    MethodSigContext,
    Plugin,
)
from mypy.plugins import dataclasses as dataclasses_plugin
from mypy.typeops import map_type_from_supertype
from mypy.types import (
    AnyType,
    CallableType,
    Instance,
    ProperType,
    Type,
    TypeOfAny,
    TypeVarType,
    UnboundType,
    get_proper_type,
)

__all__ = ["plugin"]

STRUCT = "jaxstruct.core._struct.Struct"
FIELD = "jaxstruct.core._fields.field"
DECORATORS = frozenset(
    {"jaxstruct.core._register.register_class", "jaxstruct.core._register.dataclass"}
)
# The public name: an annotation counts when it refers to what this name refers to,
# wherever jaxstruct.abc defines it.
ABSTRACT_VAR = "jaxstruct.abc.AbstractVar"
METADATA = "jaxstruct"
# mypy's dataclass support stores the signature of ``dataclasses.replace`` for each
# dataclass (every field keyword-only and optional) under this name.
MYPY_REPLACE = "__mypy-replace"


class JaxstructPlugin(Plugin):
    """The plugin class mypy instantiates (see :func:`plugin`)."""

    def get_base_class_hook(self, fullname: str) -> Callable[[ClassDefContext], None] | None:
        """Record converters and drop abstract-var declarations of struct subclasses."""
        if fullname == STRUCT or self._is_struct(fullname):
            return _prepare_class
        return None

    def get_class_decorator_hook_2(self, fullname: str) -> Callable[[ClassDefContext], bool] | None:
        """Make a ``register_class`` class a dataclass-like Struct subclass."""
        if fullname in DECORATORS:
            return _registered_class
        return None

    def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
        """Type ``obj.replace`` from the fields of ``obj``'s class."""
        if fullname == f"{STRUCT}.replace":
            return self._replace_type
        return None

    def get_method_signature_hook(
        self, fullname: str
    ) -> Callable[[MethodSigContext], CallableType] | None:
        """Type ``obj.replace(...)`` calls from the fields of ``obj``'s class."""
        owner, _, name = fullname.rpartition(".")
        if name == "replace" and self._inherits_replace(owner):
            return self._replace_signature
        return None

    def get_function_signature_hook(
        self, fullname: str
    ) -> Callable[[FunctionSigContext], CallableType] | None:
        """Widen constructor parameters of fields with converters."""
        info = self._struct_info(fullname)
        if info is not None and _converters(info):
            return self._constructor_signature
        return None

    # -- helpers ---------------------------------------------------------------------
    def _struct_info(self, fullname: str) -> TypeInfo | None:
        node = self.lookup_fully_qualified(fullname)
        info = node.node if node is not None else None
        if isinstance(info, TypeInfo) and info.has_base(STRUCT):
            return info
        return None

    def _inherits_replace(self, fullname: str) -> bool:
        info = self._struct_info(fullname)
        if info is None:
            return False
        method = info.get("replace")
        return (
            method is not None
            and method.node is not None
            and method.node.fullname == (f"{STRUCT}.replace")
        )

    def _is_struct(self, fullname: str) -> bool:
        return self._struct_info(fullname) is not None

    def _constructor_signature(self, ctx: FunctionSigContext) -> CallableType:
        signature = ctx.default_signature
        ret = get_proper_type(signature.ret_type)
        if not isinstance(ret, Instance):
            return signature
        return self._widen(signature, ret.type)

    def _replace_type(self, ctx: AttributeContext) -> Type:
        return self._replace_of(ctx.type) or ctx.default_attr_type

    def _replace_signature(self, ctx: MethodSigContext) -> CallableType:
        return self._replace_of(ctx.type) or ctx.default_signature

    def _replace_of(self, receiver_type: Type) -> CallableType | None:
        receiver = get_proper_type(receiver_type)
        bound: ProperType = receiver
        if isinstance(receiver, TypeVarType):
            bound = get_proper_type(receiver.upper_bound)
        if not isinstance(bound, Instance):
            return None
        symbol = bound.type.get_method(MYPY_REPLACE)
        stored = get_proper_type(symbol.type) if symbol is not None else None
        if not isinstance(stored, CallableType):
            return None
        owner = symbol.info if symbol is not None else bound.type
        signature = map_type_from_supertype(stored, bound.type, owner)
        signature = get_proper_type(
            _expand(signature, bound) if isinstance(signature, CallableType) else signature
        )
        if not isinstance(signature, CallableType):
            return None
        # Fields the constructor does not take (init=False, derived) cannot be replaced.
        attributes = bound.type.metadata.get("dataclass", {}).get("attributes", [])
        in_init = {a["name"] for a in attributes if a.get("is_in_init", True)}
        keep = [i for i, name in enumerate(signature.arg_names) if name in in_init]
        signature = signature.copy_modified(
            arg_names=[signature.arg_names[i] for i in keep],
            arg_types=[signature.arg_types[i] for i in keep],
            arg_kinds=[ARG_NAMED_OPT] * len(keep),
            ret_type=receiver,
            name="replace",
        )
        return self._widen(signature, bound.type)

    def _widen(self, signature: CallableType, info: TypeInfo) -> CallableType:
        converters = _converters(info)
        if not converters:
            return signature
        types = list(signature.arg_types)
        for index, name in enumerate(signature.arg_names):
            if name is not None and name in converters:
                types[index] = self._converter_input(converters[name])
        return signature.copy_modified(arg_types=types)

    def _converter_input(self, converter: str) -> Type:
        anything = AnyType(TypeOfAny.implementation_artifact)
        node = self.lookup_fully_qualified(converter) if converter else None
        target = node.node if node is not None else None
        if isinstance(target, Decorator):
            target = target.func
        if not isinstance(target, FuncDef):
            return anything
        signature = get_proper_type(target.type)
        if not isinstance(signature, CallableType) or not signature.arg_types:
            return anything
        if signature.arg_kinds[0] != ARG_POS:
            return anything
        return signature.arg_types[0]


def _expand(signature: CallableType, instance: Instance) -> Type:
    from mypy.expandtype import expand_type_by_instance

    return expand_type_by_instance(signature, instance)


def _converters(info: TypeInfo) -> dict[str, str]:
    """Field name -> converter's full name ("" when unknown), over the class and its bases."""
    out: dict[str, str] = {}
    for base in reversed(info.mro):
        out.update(base.metadata.get(METADATA, {}).get("converters", {}))
    return out


def _prepare_class(ctx: ClassDefContext) -> None:
    info = ctx.cls.info
    converters: dict[str, str] = {}
    kept = []
    for stmt in ctx.cls.defs.body:
        if isinstance(stmt, AssignmentStmt) and _is_abstract_var(ctx, stmt):
            # Not a field: the declaration only promises a read-only attribute, which
            # a subclass may provide with a field, a property or a class attribute.
            for lvalue in stmt.lvalues:
                if isinstance(lvalue, NameExpr) and isinstance(lvalue.node, Var):
                    lvalue.node.is_property = True
                    lvalue.node.is_settable_property = False
            continue
        kept.append(stmt)
        converter = _converter_of(stmt)
        if converter is not None:
            name, source = converter
            converters[name] = source
    ctx.cls.defs.body = kept
    info.metadata[METADATA] = {"converters": converters}


def _registered_class(ctx: ClassDefContext) -> bool:
    info = ctx.cls.info
    complete = dataclasses_plugin.dataclass_class_maker_callback(ctx)
    if not info.has_base(STRUCT):
        symbol = ctx.api.lookup_fully_qualified_or_none(STRUCT)
        if symbol is None or not isinstance(symbol.node, TypeInfo):
            return False
        # At runtime the class is rebuilt with bases (original, Struct); to the checker
        # it becomes a Struct subclass with its own bases kept.
        old_bases = list(info.bases)
        bases = [b for b in old_bases if b.type.fullname != "builtins.object"]
        info.bases = [*bases, Instance(symbol.node, [])]
        info.mro = []  # calculate_mro reuses a computed MRO
        try:
            calculate_mro(info)
        except MroError:
            info.bases = old_bases
            info.mro = []
            calculate_mro(info)
            return complete
        info.metaclass_type = info.calculate_metaclass_type()
        _prepare_class(ctx)
    return complete


def _is_abstract_var(ctx: ClassDefContext, stmt: AssignmentStmt) -> bool:
    annotation = stmt.unanalyzed_type
    if not isinstance(annotation, UnboundType) or not isinstance(stmt.rvalue, TempNode):
        return False
    symbol = ctx.api.lookup_qualified(annotation.name, ctx.cls, suppress_errors=True)
    if symbol is None or symbol.node is None:
        return False
    public = ctx.api.lookup_fully_qualified_or_none(ABSTRACT_VAR)
    return public is not None and public.node is symbol.node


def _converter_of(stmt: Any) -> tuple[str, str] | None:
    if not isinstance(stmt, AssignmentStmt) or len(stmt.lvalues) != 1:
        return None
    lvalue, call = stmt.lvalues[0], stmt.rvalue
    if not isinstance(lvalue, NameExpr) or not isinstance(call, CallExpr):
        return None
    if not isinstance(call.callee, RefExpr) or call.callee.fullname != FIELD:
        return None
    for name, value in zip(call.arg_names, call.args, strict=True):
        if name == "converter":
            if isinstance(value, RefExpr) and not isinstance(value, LambdaExpr):
                return lvalue.name, value.fullname or ""
            return lvalue.name, ""
    return None


def plugin(version: str) -> type[Plugin]:
    """The entry point mypy calls (``plugins = ["jaxstruct.core.mypy_plugin"]``)."""
    return JaxstructPlugin
