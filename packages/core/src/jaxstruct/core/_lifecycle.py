"""The construction lifecycle shared by ``__init__``, ``replace`` and ``build``.

Order (the specification's): assign with converters; derived fields; the user's
``__post_init__`` (the instance is still mutable); derived fields again;
static-field checks and validators; freeze; ``__check_init__`` invariants (on
the frozen instance). Unflattening never comes here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ._constraints import Constraint, is_traced
from ._errors import (
    Refusal,
    TracedCheckError,
    UnassignedFieldError,
    ValidationError,
    attach_refusal,
    traced_check_message,
)
from ._fields import MISSING
from ._layout import Layout

__all__ = [
    "BUILDING",
    "SAFE_STATIC_TYPES",
    "assign_arguments",
    "bound_method_message",
    "building",
    "check_static",
    "compute_derived",
    "finish",
    "new_from_values",
]

_osa = object.__setattr__
_new = object.__new__

#: What JAX raises when code reads the value of a tracer (a check inside ``jit``).
TRACER_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
)

# Types whose instances are always hashable and array-free: the static check skips them.
SAFE_STATIC_TYPES = frozenset({int, str, float, bool, complex, bytes, type(None)})


#: The ids of the instances being built, in any thread (see :func:`building`).
#: One plain set rather than a thread-local one: first flattens check it, and a
#: thread-local lookup would cost them more than the check itself. Ids are
#: unique among live objects and each builder removes its own.
BUILDING: set[int] = set()


def building() -> set[int]:
    """Return the ids of the instances under construction (still mutable)."""
    return BUILDING


def check_static(cls: type, name: str, value: Any) -> None:
    """Reject a static value that is an array or unhashable, naming the field and the fix."""
    if isinstance(value, np.ndarray | jax.Array):
        err = ValidationError(
            f"static field {cls.__qualname__}.{name} holds an array ({_describe(value)}); "
            "static fields are hashed into the tree structure. Make it a node field "
            "(drop static=True) or store a tuple of Python numbers"
        )
        raise attach_refusal(
            err, Refusal(cls, name, "static", f"holds an array ({_describe(value)})")
        )
    try:
        hash(value)
    except TypeError:
        err = ValidationError(
            f"static field {cls.__qualname__}.{name} must be hashable, got "
            f"{type(value).__name__} {value!r}; use an immutable value (tuple, frozenset), "
            "or make it a node field (drop static=True) or opaque (pytree=False)"
        )
        reason = f"unhashable {type(value).__name__}"
        raise attach_refusal(err, Refusal(cls, name, "static", reason)) from None


def bound_method_message(cls: type, name: str, method: str) -> str:
    """The error for storing a bound method of the instance being built in field ``name``."""
    return (
        f"{cls.__qualname__}.{name}: self.{name} = self.{method} stores a bound method of the "
        "instance itself, so the struct would refer to itself, which a pytree cannot "
        "represent (after jit, tree_map or unflatten the field would still call the old "
        f"instance). Call self.{method}(...) where it is needed, or store the plain function "
        f"(type(self).{method}) and pass the instance when calling it"
    )


def _describe(value: Any) -> str:
    shape = ",".join(str(d) for d in getattr(value, "shape", ()))
    return f"{getattr(value, 'dtype', type(value).__name__)}[{shape}]"


def compute_derived(obj: Any, layout: Layout) -> None:
    takes_self = layout.resolve()["derived"]
    for spec in layout.derived:
        fn = spec.derived
        assert fn is not None
        value = fn(obj) if takes_self[spec.name] else fn()
        if spec.converter is not None:
            value = layout.convert(obj, spec, value)
        _osa(obj, spec.name, value)


def _validate(obj: Any, layout: Layout, source: Any = None) -> None:
    """Run static-field checks and validators; with ``source``, skip what ``replace`` kept.

    A field holding the very object ``source`` (the instance ``replace`` copied)
    holds was checked when ``source`` was built: checking it again would cost
    every ``replace`` and, under ``jit``, read a traced value for nothing.
    """
    cls = layout.cls
    for name in layout.static_checked:
        value = getattr(obj, name)
        if type(value) not in SAFE_STATIC_TYPES:
            if source is not None and value is getattr(source, name, MISSING):
                continue
            check_static(cls, name, value)
    if layout.validated:
        table = layout.resolve()["validators"]
        for spec in layout.validated:
            name = spec.name
            value = getattr(obj, name)
            if source is not None and value is getattr(source, name, MISSING):
                continue
            for fn, takes_self in table[name]:
                try:
                    result = fn(obj, value) if takes_self else fn(value)
                    if result is True or result is None:
                        continue
                    ok = _truthy(result)
                except TRACER_ERRORS as err:
                    raise TracedCheckError(traced_check_message(cls, name, fn, err)) from err
                except Exception as err:
                    reason = f"{_validator(fn)} raised {type(err).__name__}: {err}"
                    attach_refusal(err, Refusal(cls, name, "validator", reason, fn))
                    raise
                if not ok:
                    reason = _rejection(fn, value)
                    err = ValidationError(
                        f"{cls.__qualname__}.{spec.name}: {reason}; pass a value it accepts"
                    )
                    raise attach_refusal(err, Refusal(cls, spec.name, "validator", reason, fn))


def _rejection(fn: Any, value: Any) -> str:
    """Why ``fn`` refused ``value``, in a few words (a constraint says what is wrong)."""
    if isinstance(fn, Constraint):
        why = fn.explain(value)
        return f"{fn!r} refused {_short(value)}" + (f": {why}" if why else "")
    return f"{_validator(fn)} rejected {_short(value)}"


def _validator(fn: Any) -> str:
    return f"validator {getattr(fn, '__qualname__', fn)!r}"


def _truthy(result: Any) -> bool:
    if result is True or result is False:
        return result
    if is_traced(result):
        # A jnp comparison of a traced value: what it says is known only when run.
        raise jax.errors.TracerBoolConversionError(result)
    try:
        return bool(np.all(np.asarray(result)))
    except (TypeError, ValueError):
        return bool(result)


def _short(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return _describe(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_complete(obj: Any, layout: Layout) -> None:
    missing = [f.name for f in layout.fields if getattr(obj, f.name, MISSING) is MISSING]
    if missing:
        names = ", ".join(repr(n) for n in missing)
        err = UnassignedFieldError(
            f"{layout.cls.__qualname__}: field(s) {names} were never assigned; give them a "
            "default or assign them in __init__ / __post_init__"
        )
        reason = f"field(s) {names} never assigned"
        raise attach_refusal(err, Refusal(layout.cls, missing[0], "missing", reason))


def finish(
    obj: Any,
    layout: Layout,
    *,
    post_init: bool = True,
    initvars: tuple[Any, ...] = (),
    source: Any = None,
) -> None:
    """Run steps 2-5 of the lifecycle on ``obj`` (its fields already assigned).

    ``__post_init__`` is the class's current one (assigning a new one to a
    struct class later takes effect); it receives the ``InitVar`` values, in
    declaration order, after ``self``. ``source`` is the instance ``replace``
    copied ``obj`` from: fields still holding its values are not validated again.
    """
    ids = BUILDING
    key = id(obj)
    fresh = key not in ids
    if fresh:
        ids.add(key)
    try:
        if layout.derived:
            compute_derived(obj, layout)
        if post_init:
            # Kept current by StructMeta.__setattr__ when a class's hook is patched
            # (a lookup on the class here would cost every construction).
            hook = layout.post_init
            if hook is not None:
                try:
                    if initvars:
                        hook(obj, *initvars)
                    else:
                        hook(obj)
                except Exception as err:
                    _refused_by_hook(err, layout.cls, "post_init", hook)
                    raise
            # Derived fields run a second time even without __post_init__, as
            # the lifecycle promises (a derived callable may count its calls).
            if layout.derived:
                compute_derived(obj, layout)
        _check_complete(obj, layout)
        _validate(obj, layout, source)
    finally:
        if fresh:
            ids.discard(key)
    if layout.checks:
        # __check_init__ sees the frozen instance (as in equinox): an invariant
        # check that assigns a field is a bug, so it raises FrozenStructError.
        ids.discard(key)
        try:
            for check in layout.checks:
                try:
                    check(obj)
                except Exception as err:
                    _refused_by_hook(err, layout.cls, "check_init", check)
                    raise
        finally:
            if not fresh:
                ids.add(key)


def _refused_by_hook(err: Exception, cls: type, check: Any, hook: Any) -> None:
    """Record that ``hook`` (``__post_init__`` or a check) of ``cls`` raised ``err``.

    A hook that read a traced value (inside ``jit``) refused nothing: that is
    a :class:`TracedCheckError` saying how to write the hook, raised instead.
    """
    if isinstance(err, TRACER_ERRORS):
        raise TracedCheckError(traced_check_message(cls, None, hook, err)) from err
    name = getattr(hook, "__qualname__", None) or repr(hook)
    attach_refusal(
        err, Refusal(cls, None, check, f"{name} raised {type(err).__name__}: {err}", hook)
    )


def new_from_values(cls: type, layout: Layout, values: Mapping[str, Any], *, convert: bool) -> Any:
    """Create an instance of ``cls`` from field values without calling ``__init__``.

    Used by ``build`` (deserialisation): converters run on the given values,
    defaults fill the gaps, then derived fields, validators and checks run;
    ``__post_init__`` does not (the stored values are already post-init values).
    """
    unknown = [k for k in values if k not in layout.by_name]
    if unknown:
        names = ", ".join(map(repr, unknown))
        err = ValidationError(
            f"{cls.__qualname__} has no field(s) {names}; its fields are {list(layout.by_name)}"
        )
        raise attach_refusal(err, Refusal(cls, unknown[0], "unknown", f"no field(s) {names}"))
    obj = _new(cls)
    for spec in layout.fields:
        if spec.derived is not None:
            continue
        value = values.get(spec.name, MISSING)
        if value is MISSING:
            if not spec.has_default:
                if spec.init or not layout.post_init:
                    err = ValidationError(
                        f"{cls.__qualname__}: required field {spec.name!r} is missing"
                    )
                    raise attach_refusal(err, Refusal(cls, spec.name, "missing", "missing"))
                continue
            value = spec.make_default()
        elif convert and spec.converter is not None:
            value = layout.convert(obj, spec, value)
        _osa(obj, spec.name, value)
    finish(obj, layout, post_init=False)
    return obj


def assign_arguments(
    obj: Any,
    layout: Layout,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    keep_assigned: bool = False,
) -> tuple[Any, ...]:
    """Bind constructor arguments to fields generically (the slow path of ``__init__``).

    Returns the ``InitVar`` values in declaration order. With ``keep_assigned``
    (a user's ``__init__`` calling ``super().__init__(...)``), fields not among
    the arguments keep the values already assigned to them, and required ones
    may still be assigned afterwards (``finish`` reports any left unassigned).
    """
    cls = layout.cls
    positional = [f for f in layout.init_params if not f.kw_only]
    if len(args) > len(positional):
        raise TypeError(
            f"{cls.__qualname__}() takes {len(positional)} positional argument(s) but "
            f"{len(args)} were given"
        )
    values = dict(zip((f.name for f in positional), args, strict=False))
    params = {f.name: f for f in layout.init_params}
    for name, value in kwargs.items():
        spec = params.get(name)
        if spec is None:
            raise TypeError(f"{cls.__qualname__}() got an unexpected keyword argument {name!r}")
        if name in values:
            raise TypeError(f"{cls.__qualname__}() got multiple values for argument {name!r}")
        values[name] = value
    initvars: list[Any] = []
    for spec in layout.initvars:
        value = values.get(spec.name, MISSING)
        if value is MISSING:
            if not spec.has_default and not keep_assigned:
                raise TypeError(f"{cls.__qualname__}() missing required argument {spec.name!r}")
            value = spec.make_default() if spec.has_default else None
        initvars.append(value)
    for spec in layout.fields:
        if spec.derived is not None:
            continue
        if spec.name in values:
            value = values[spec.name]
        elif keep_assigned and getattr(obj, spec.name, MISSING) is not MISSING:
            continue
        elif spec.has_default:
            value = spec.make_default()
        elif spec.init and not keep_assigned:
            raise TypeError(f"{cls.__qualname__}() missing required argument {spec.name!r}")
        else:
            continue
        if spec.converter is not None:
            value = layout.convert(obj, spec, value)
        _osa(obj, spec.name, value)
    return tuple(initvars)
