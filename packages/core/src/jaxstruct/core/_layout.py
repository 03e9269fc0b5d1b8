"""The per-class table every hot path reads: field order, kinds and hook flags.

It is built once when the class is created and never per instance. Hook
arities (one- or two-argument converters and validators, zero- or
one-argument derived callables) are decided lazily, once, the first time an
instance is built, so defining a class stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from jax.tree_util import GetAttrKey

from ._errors import Refusal, attach_refusal
from ._fields import FieldKind, FieldSpec, required_positional

__all__ = ["FLAT", "KEYED", "Layout", "Opaque", "converter_failed"]

# Instance attribute caching the flattened form ``(children, aux)``; flatten is
# ``operator.attrgetter(FLAT)``, so JAX flattens a struct without calling Python.
# It is filled on first use (see ``_cache``) and by unflatten.
FLAT = "_jaxstruct_flat"
# The same with keys, ``(((key, child), ...), aux)``, read by flatten-with-path.
KEYED = "_jaxstruct_keyed"


class Opaque:
    """Aux-data wrapper carrying opaque field values by identity.

    Two wrappers are equal when they hold the very same objects, so ``jit``'s
    cache never hashes or compares the values themselves.
    """

    __slots__ = ("values",)

    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = values

    def __eq__(self, other: object) -> bool:
        if type(other) is not Opaque:
            return NotImplemented
        theirs = other.values
        return len(theirs) == len(self.values) and all(
            a is b for a, b in zip(self.values, theirs, strict=True)
        )

    def __hash__(self) -> int:
        return hash(tuple(map(id, self.values)))

    def __repr__(self) -> str:
        return f"<opaque x{len(self.values)}>"


class Layout:
    """Field tables and hook flags of one struct class."""

    __slots__ = (
        "by_name",
        "checks",
        "cls",
        "compare_names",
        "converters",
        "dataclass_fields",
        "derived",
        "fields",
        "flat_of",
        "has_hooks",
        "init_fields",
        "init_fn",
        "init_params",
        "initvars",
        "keys",
        "members",
        "node_names",
        "opaque_names",
        "post_init",
        "repr_names",
        "resolved",
        "static_checked",
        "static_names",
        "unflatten",
        "user_init",
        "validated",
    )

    def __init__(
        self,
        cls: type,
        fields: tuple[FieldSpec, ...],
        *,
        user_init: bool,
        members: tuple[FieldSpec, ...] | None = None,
    ) -> None:
        self.cls = cls
        self.fields = fields
        self.members = members or fields
        # ``members`` is ``fields`` with the InitVar pseudo-fields in declaration order.
        if members is None or len(members) == len(fields):
            self.initvars: tuple[FieldSpec, ...] = ()
            self.init_params = tuple(f for f in fields if f.init and f.derived is None)
        else:
            self.initvars = tuple(f for f in members if f.initvar)
            self.init_params = tuple(
                f for f in members if f.initvar or (f.init and f.derived is None)
            )
        self.by_name = {f.name: f for f in fields}
        self.node_names = tuple(f.name for f in fields if f.kind is FieldKind.NODE)
        self.static_names = tuple(f.name for f in fields if f.kind is FieldKind.STATIC)
        self.opaque_names = tuple(f.name for f in fields if f.kind is FieldKind.OPAQUE)
        self.static_checked = tuple(
            f.name for f in fields if f.kind is FieldKind.STATIC and f.derived is None
        )
        self.init_fields = tuple(f for f in fields if f.init and f.derived is None)
        self.repr_names = tuple(f.name for f in fields if f.repr)
        self.compare_names = tuple(f.name for f in fields if f.compare)
        self.keys = tuple(GetAttrKey(n) for n in self.node_names)
        self.derived = tuple(f for f in fields if f.derived is not None)
        self.converters = any(f.converter is not None for f in fields)
        self.validated = tuple(f for f in fields if f.validators)
        self.user_init = user_init
        self.post_init: Callable[..., None] | None = None
        self.checks: tuple[Callable[[Any], Any], ...] = ()
        self.has_hooks = False
        self.refresh_hooks()
        # The compiled ``__init__`` (see _codegen.generate_init), once built.
        self.init_fn: Any = None
        # ``dataclasses.Field`` objects for the dataclass protocol, built on first use.
        self.dataclass_fields: dict[str, Any] | None = None
        # Filled by resolve(): (spec, takes_self) pairs per hook.
        self.resolved: dict[str, Any] | None = None
        # The unflatten function registered with JAX (see _codegen.lazy_unflatten).
        self.unflatten: Any = None
        # Specialised ``obj -> (children, aux)``, compiled on first use.
        self.flat_of: Callable[[Any], tuple[Any, Any]] | None = None

    def refresh_hooks(self) -> None:
        """Read ``__post_init__`` and ``__check_init__`` from the class again (after a patch)."""
        cls = self.cls
        self.post_init = getattr(cls, "__post_init__", None)
        self.checks = tuple(
            c.__dict__["__check_init__"]
            for c in reversed(cls.__mro__)
            if "__check_init__" in c.__dict__
        )
        # An init=False field without a default is assigned by __post_init__ or
        # not at all; only finish() reports the second case, so it counts as a hook.
        unassigned = any(
            not f.init and not f.has_default and f.derived is None for f in self.fields
        )
        self.has_hooks = bool(
            self.derived
            or self.validated
            or self.post_init is not None
            or self.checks
            or self.user_init
            or unassigned
            or self.initvars
        )

    def resolve(self) -> dict[str, Any]:
        """Decide hook arities once (inspecting signatures, never calling) and cache them."""
        if self.resolved is None:
            conv: dict[str, bool] = {}
            vals: dict[str, tuple[tuple[Callable[..., Any], bool], ...]] = {}
            der: dict[str, bool] = {}
            for f in self.fields:
                if f.converter is not None:
                    conv[f.name] = (required_positional(f.converter) or 1) >= 2
                if f.validators:
                    vals[f.name] = tuple(
                        (v, (required_positional(v) or 1) >= 2) for v in f.validators
                    )
                if f.derived is not None:
                    der[f.name] = (required_positional(f.derived) or 0) >= 1
            self.resolved = {"converters": conv, "validators": vals, "derived": der}
        return self.resolved

    def convert(self, obj: Any, spec: FieldSpec, value: Any) -> Any:
        """Apply ``spec``'s converter to ``value`` (in whichever form it was declared)."""
        conv = spec.converter
        if conv is None:
            return value
        try:
            if self.resolve()["converters"][spec.name]:
                return conv(obj, value)
            return conv(value)
        except Exception as err:
            converter_failed(self.cls, spec.name, conv, err)


def converter_failed(cls: type, name: str, converter: Any, err: Exception) -> NoReturn:
    """Re-raise ``err`` from a converter with the class and field named, keeping its type.

    The new exception is of the same type as ``err`` and chained to it; when
    that type cannot be built from one message, ``err`` itself is re-raised
    with a note (PEP 678) naming the class and field.
    """
    where = f"{cls.__qualname__}.{name}"
    label = getattr(converter, "__qualname__", None) or repr(converter)
    reason = f"converter {label} raised {type(err).__name__}: {err}"
    message = f"{where}: {reason}; pass a value the converter accepts"
    try:
        wrapped = type(err)(message)
    except Exception:
        wrapped = None
    if wrapped is None or str(wrapped) != message:
        err.add_note(f"while converting {where} with {label}")
        raise attach_refusal(err, Refusal(cls, name, "converter", reason, converter))
    raise attach_refusal(wrapped, Refusal(cls, name, "converter", reason, converter)) from err
