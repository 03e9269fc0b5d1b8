"""``structs(cls)``: valid instances of any struct class, drawn from its field annotations."""

import contextvars
import enum
import inspect
import math
import sys
import types
import typing
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import jaxstruct.core as js
from hypothesis import event, note, reject
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.reporting import debug_report
from jaxstruct.core import FieldKind, FieldSpec

from ._abstract import is_abstract_class
from ._arrays import (
    CURRENT_SIZES,
    DEFAULT_DTYPES,
    LIVE,
    ArrayRequest,
    SizeTable,
    array_request,
    arrays_for,
    bind_sizes,
    fixed_dim,
    floats_of_width,
    is_key_array,
    key_impl_of,
    key_request,
    merge_requests,
    numpy_scalars,
)
from ._checks import BUILT, NOTHING, Checks, checks_from
from ._constraints import converter_input, narrowed
from ._options import DrawOptions
from ._plan import Plan, bindings_inside, split_sizes
from ._refusals import describe_refusal, drawing_field, record_attempt, record_refusal
from ._shown import Shown
from ._upfront import Upfront, upfront_sizes

__all__ = ["hashable_values", "nested_structs", "structs", "value_strategy"]

_SCALARS: dict[Any, Callable[[], st.SearchStrategy[Any]]] = {
    int: lambda: st.integers(-(2**31), 2**31 - 1),
    # NaN is left out of Python floats: ``x == x`` must hold for struct equality.
    float: lambda: st.floats(allow_nan=False),
    bool: st.booleans,
    str: lambda: st.text(max_size=8),
    bytes: lambda: st.binary(max_size=8),
    complex: lambda: st.complex_numbers(allow_nan=False),
    type(None): st.none,
}


def hashable_values() -> st.SearchStrategy[Any]:
    """Return a strategy of small hashable, array-free values (what a static field may hold).

    Example:
        >>> from hypothesis import find
        >>> from jaxstruct.testing import hashable_values
        >>> value = find(hashable_values(), lambda v: isinstance(v, tuple))
        >>> hash(value) == hash(value)
        True
    """
    scalars = st.none() | st.booleans() | st.integers(-100, 100) | st.text(max_size=4)
    return st.recursive(
        scalars, lambda inner: st.tuples(inner) | st.tuples(inner, inner), max_leaves=4
    )


def _node_leaves(sizes: dict[str, Any]) -> st.SearchStrategy[Any]:
    leaves = (
        arrays_for(_any_array(), sizes)
        | floats_of_width(32, allow_nan=False)
        | st.integers(-(2**31), 2**31 - 1)
    )
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=2)
            | st.tuples(inner, inner)
            | st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), inner, max_size=2)
        ),
        max_leaves=4,
    )


def _any_array() -> ArrayRequest:
    return ArrayRequest("any", DEFAULT_DTYPES, None)


def _real(request: ArrayRequest) -> ArrayRequest:
    """The request without complex dtypes, unless it asks for nothing else."""
    dtypes = tuple(d for d in request.dtypes if not d.startswith("complex"))
    return ArrayRequest(request.kind, dtypes, request.dims) if dtypes else request


def _converter_leaves(sizes: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values for an unannotated field with a converter: real array-likes, never containers."""
    return (
        arrays_for(_real(_any_array()), sizes)
        | floats_of_width(32, allow_nan=False)
        | st.integers(-(2**31), 2**31 - 1)
    )


def value_strategy(
    annotation: Any,
    *,
    kind: FieldKind = FieldKind.NODE,
    sizes: dict[str, Any] | None = None,
    real: bool = False,
    checks: Checks = NOTHING,
    honoured: set[str] | None = None,
) -> st.SearchStrategy[Any] | None:
    """Return a strategy for values of ``annotation`` in a field of ``kind``, or ``None``.

    ``None`` means the annotation says nothing usable (``object``, ``Any``, no
    annotation); callers then fall back to a default for the kind. With
    ``real``, arrays whose dtype the annotation leaves open are not complex
    (used for values a converter will cast). ``checks`` (and the constraints
    and ``ge``/``gt``/``le``/``lt`` bounds in ``Annotated`` metadata) are
    built into arrays and numbers; the kinds of check built in are added to
    ``honoured`` (what no filter needs to check again).
    """
    sizes = {} if sizes is None else sizes
    if annotation is None or annotation is typing.Any or annotation is object:
        return None
    if isinstance(annotation, str | typing.ForwardRef):
        return None
    request = array_request(annotation)
    if request is not None:
        request = request.with_checks(checks)
        if honoured is not None and not checks.empty:
            honoured.update(BUILT)
        return arrays_for(_real(request) if real else request, sizes)
    if annotation in (int, float) and not checks.empty:
        bounded = _bounded_number(annotation, checks)
        if honoured is not None:
            honoured.update({"finite", "bounded"})
        return bounded
    if annotation in _SCALARS:
        return _SCALARS[annotation]()
    scalars = numpy_scalars(annotation)
    if scalars is not None:
        return scalars
    if isinstance(annotation, type):
        if js.is_struct(annotation) or (
            issubclass(annotation, js.Struct) and is_abstract_class(annotation)
        ):
            return st.deferred(lambda: _nested(annotation))
        if issubclass(annotation, enum.Enum):
            return st.sampled_from(list(annotation))
        if issubclass(annotation, tuple) and hasattr(annotation, "_fields"):
            return _named_tuples(annotation, kind, sizes, real)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        found = checks.merge(checks_from(getattr(annotation, "__metadata__", ())))
        return value_strategy(
            args[0], kind=kind, sizes=sizes, real=real, checks=found, honoured=honoured
        )
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is typing.Union or origin is types.UnionType:
        requests = [r for r in map(array_request, args) if r is not None]
        # jaxtyping's PRNGKeyArray also admits raw uint32 key data: draw typed keys.
        keys = [r for r in requests if r.kind == "key"]
        if keys:
            return arrays_for(keys[0], sizes)
        if requests:
            # An array annotation written as a union (chex.Array, jax.typing.ArrayLike,
            # np.ndarray | np.number): arrays of its array members, None if it allows it.
            merged = merge_requests(requests).with_checks(checks)
            if honoured is not None and not checks.empty:
                honoured.update(BUILT)
            drawn = arrays_for(_real(merged) if real else merged, sizes)
            return st.none() | drawn if type(None) in args else drawn
        parts = [value_strategy(a, kind=kind, sizes=sizes, real=real, checks=checks) for a in args]
        if any(p is None for p in parts):
            return None
        return st.one_of(*typing.cast(list[st.SearchStrategy[Any]], parts))
    if origin in (list, tuple, dict, set, frozenset) or annotation in (list, tuple, dict):
        return _container(origin or annotation, args, kind, sizes, real)
    if isinstance(annotation, type):
        try:
            return st.from_type(annotation)
        except (InvalidArgument, TypeError):  # pragma: no cover - defensive
            return None
    return None


def _bounded_number(annotation: type, checks: Checks) -> st.SearchStrategy[Any]:
    """Ints or floats inside ``checks``' bounds (finite floats when it says so)."""
    if annotation is int:
        low = -(2**31) if checks.lo is None else checks.lo
        high = 2**31 - 1 if checks.hi is None else checks.hi
        low = math.floor(low) + 1 if checks.exclude_lo else math.ceil(low)
        high = math.ceil(high) - 1 if checks.exclude_hi else math.floor(high)
        return st.integers(low, high)
    return st.floats(
        min_value=checks.lo,
        max_value=checks.hi,
        exclude_min=checks.exclude_lo,
        exclude_max=checks.exclude_hi,
        allow_nan=False,
        allow_infinity=False if checks.finite else None,
    )


def _named_tuples(
    cls: type, kind: FieldKind, sizes: dict[str, Any], real: bool
) -> st.SearchStrategy[Any]:
    """Instances of a namedtuple class (optax's states), each field drawn from its annotation.

    Hypothesis' own ``from_type`` resolves the annotations, and fails on the
    forward references libraries leave in them (optax's ``ArrayTree``); each
    field is drawn here from what can be read, the rest as a node's default.
    """
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # unresolvable forward references: the annotations as written
        hints = dict(getattr(cls, "__annotations__", {}))
    fields: tuple[str, ...] = getattr(cls, "_fields", ())
    parts: list[st.SearchStrategy[Any]] = []
    for name in fields:
        found = value_strategy(hints.get(name), kind=kind, sizes=sizes, real=real)
        parts.append(_default_for(kind, sizes) if found is None else found)
    return st.tuples(*parts).map(lambda values: cls(*values))


def _container(
    origin: Any, args: tuple[Any, ...], kind: FieldKind, sizes: dict[str, Any], real: bool
) -> st.SearchStrategy[Any]:
    def item(a: Any) -> st.SearchStrategy[Any]:
        found = value_strategy(a, kind=kind, sizes=sizes, real=real)
        return found if found is not None else _default_for(kind, sizes)

    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(item(args[0]), max_size=3).map(tuple)
        if args == ((),):
            return st.just(())
        if args:
            return st.tuples(*(item(a) for a in args))
        return st.lists(_default_for(kind, sizes), max_size=3).map(tuple)
    inner = item(args[0]) if args else _default_for(kind, sizes)
    if origin is list:
        return st.lists(inner, max_size=3)
    if origin in (set, frozenset):
        return st.frozensets(inner.filter(_is_hashable), max_size=3).map(origin)
    keys = item(args[0]) if args else st.text("abcxyz", min_size=1, max_size=3)
    values = item(args[1]) if len(args) == 2 else _default_for(kind, sizes)
    return st.dictionaries(keys.filter(_is_hashable), values, max_size=3)


def _is_hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _default_for(kind: FieldKind, sizes: dict[str, Any]) -> st.SearchStrategy[Any]:
    if kind is FieldKind.NODE:
        return _node_leaves(sizes)
    if kind is FieldKind.STATIC:
        return hashable_values()
    return st.none() | st.integers() | st.text(max_size=4)


def _defining_namespace(cls: type) -> dict[str, Any] | None:
    """Find the globals of the module body that defined ``cls`` (it may not be in sys.modules).

    Classes defined by ``exec`` (notebooks, doc runners) have no module to
    resolve postponed annotations in; any function defined next to them (a
    method, a converter, a validator) carries those globals.
    """
    module = sys.modules.get(cls.__module__)
    if module is not None:
        return vars(module)
    candidates: list[Any] = list(vars(cls).values())
    for spec in js.fields(cls).values():
        candidates += [spec.converter, spec.derived, spec.default_factory, *spec.validators]
    for value in candidates:
        found = getattr(inspect.unwrap(value), "__globals__", None) if callable(value) else None
        if isinstance(found, dict) and found.get("__name__") == cls.__module__:
            return found
    return None


#: Resolved annotations per class (evaluating string annotations is most of a draw's cost).
_HINTS: weakref.WeakKeyDictionary[type, dict[str, Any]] = weakref.WeakKeyDictionary()


def _hints(cls: type) -> dict[str, Any]:
    found = _HINTS.get(cls)
    if found is not None:
        return found
    try:
        found = typing.get_type_hints(cls, include_extras=True)
    except Exception:
        pass
    else:
        _HINTS[cls] = found  # only when complete: a name defined later may resolve then
        return found
    # Resolve field by field, so one unresolvable name loses only its own field.
    namespace = _defining_namespace(cls)
    hints: dict[str, Any] = {}
    for name, spec in js.fields(cls).items():
        annotation = spec.type
        if isinstance(annotation, str) and namespace is not None:
            try:
                annotation = eval(annotation, dict(namespace))
            except Exception:
                annotation = None
        hints[name] = annotation
    return hints


def _concrete_subclasses(cls: type) -> list[type]:
    found: list[type] = []
    stack = [cls]
    while stack:
        klass = stack.pop()
        for sub in type.__subclasses__(klass):
            stack.append(sub)
            if js.is_struct(sub) and not is_abstract_class(sub) and sub not in found:
                found.append(sub)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


def _field_strategy(
    cls: type, spec: FieldSpec, annotation: Any, sizes: dict[str, Any]
) -> st.SearchStrategy[Any]:
    converted = spec.converter is not None
    found = None
    if is_key_array(spec.default):
        # A typed-key default names the implementation and shape to draw.
        impl = key_impl_of(spec.default)
        return arrays_for(key_request(impl, tuple(fixed_dim(n) for n in spec.default.shape)), sizes)
    # The constraints among the validators are built into the draws, where the
    # annotation says what to draw (arrays, numbers); the others filter.
    checks = checks_from(spec.validators, validated=bool(spec.validators))
    honoured: set[str] = set()
    accepts = converter_input(spec)
    if accepts is not None:
        # Draw what the converter takes, not what it returns.
        found = value_strategy(
            accepts, kind=spec.kind, sizes=sizes, checks=checks, honoured=honoured
        )
    if found is None:
        accepts = annotation
        found = value_strategy(
            annotation,
            kind=spec.kind,
            sizes=sizes,
            real=converted,
            checks=checks,
            honoured=honoured,
        )
    leftover: tuple[Any, ...] = ()
    if honoured:
        leftover = _leftover(annotation, checks)
    if found is None:
        if converted and spec.kind is FieldKind.NODE:
            found = _converter_leaves(sizes)
        else:
            found = _default_for(spec.kind, sizes)
    # Static values must be hashable (with a converter: the converted value). The
    # check comes after the validators' bounds: a filter in front of the drawn
    # numbers would keep Hypothesis from reading ``0 <= p < 1`` as bounds.
    return narrowed(
        spec,
        found,
        accepts,
        hashable=spec.kind is FieldKind.STATIC,
        cls=cls,
        honoured=frozenset(honoured),
        leftover=leftover,
    )


def _leftover(annotation: Any, checks: Checks) -> tuple[Any, ...]:
    """The constraints the draw could not build in (bounds on a covariance, two structures)."""
    found = checks
    while typing.get_origin(annotation) is typing.Annotated:
        found = found.merge(checks_from(getattr(annotation, "__metadata__", ())))
        annotation = typing.get_args(annotation)[0]
    return found.leftover


def structs(
    cls: type[Any], /, *, sizes: Any = None, dtypes: Any = None, **overrides: Any
) -> st.SearchStrategy[Any]:
    """Return a strategy of valid instances of the struct class ``cls``.

    Field values come from the annotations: arrays (NumPy or JAX, dtypes and
    shapes from ``np.ndarray``, ``jax.Array`` or jaxtyping annotations, or
    unions with an array member such as ``chex.Array`` and
    ``jax.typing.ArrayLike``; typed PRNG keys for ``Key[Array, ...]``),
    nested structs (through ``st.from_type``, so registered strategies are
    used; they share the named sizes of the instance), namedtuples (optax's
    states), containers, scalars, NumPy scalars, enums and literals; static
    fields only get hashable values; fields with a default sometimes keep it.
    Values are made valid field by field where the declaration allows:
    bounds in ``Annotated`` metadata, comparisons in one-argument validators
    (read by Hypothesis' filter rewriting), a converter's annotated input
    type, and no complex arrays for converters.
    Construction then runs converters and validators as usual. A draw the
    class refuses on purpose (a ``ValidationError``, or a ``ValueError`` or
    ``AssertionError`` raised by a validator or ``__check_init__``) is
    discarded; any other exception fails the test. Under pytest, a class that
    refuses over 10% of its draws in a test is reported at its end
    (``RefusalWarning``). An abstract class (abstract
    methods or vars, or ``abstract=True``) draws from its concrete subclasses.

    Args:
        cls: the struct class.
        sizes: how jaxtyping named sizes (and free dimensions) are drawn: an
            int, a few ints (``(2, 5)``: few shapes, so ``jit`` compiles reused),
            a ``range``, a strategy of ints, or a mapping from size names to
            those. A mapping value that is a string binds the size to an int
            field (``{"chains": "n_chains"}``), or to an int field of a nested
            struct field by its path (``{"d": "config.d_model"}``): the field is
            drawn first and every ``chains`` dimension takes its value. Nested
            structs inherit it.
            (So a field named ``sizes`` or ``dtypes`` takes no override by keyword.)
        dtypes: the dtypes to draw (names or NumPy dtypes), among those each
            annotation allows. Nested structs inherit it.
        **overrides: per field name, a strategy used instead of the inferred
            one, or a function whose parameters name other fields, returning
            the strategy given the values drawn for them
            (``w=lambda n_sites: arrays(..., sizes=n_sites)``). The named sizes an
            override's arrays show bind the other fields.

    Returns:
        A Hypothesis strategy of ``cls`` instances.

    Raises:
        TypeError: ``cls`` is not a struct class; an override is neither a
            strategy nor a function of other fields (or they depend on each
            other in a cycle); an override or a size binding names no
            constructor field (of any concrete subclass, for an abstract
            ``cls``); a static field's annotation admits no hashable value; or
            no value can be drawn for a field's annotation.

    Example:
        >>> import numpy as np
        >>> from hypothesis import given, settings, strategies as st
        >>> import jaxstruct.core as js
        >>> from jaxstruct.testing import structs
        >>> class Point(js.Struct):
        ...     xy: np.ndarray
        ...     label: str = js.field(static=True, default="p")
        >>> @settings(max_examples=5)
        ... @given(structs(Point, label=st.sampled_from(["a", "b"])))
        ... def test(p):
        ...     assert isinstance(p.xy, np.ndarray) and p.label in ("a", "b", "p")
        >>> test()
    """
    return _structs(cls, sizes, dtypes, overrides, strict=True)


def _structs(
    cls: type[Any], sizes: Any, dtypes: Any, overrides: Mapping[str, Any], *, strict: bool
) -> st.SearchStrategy[Any]:
    if not (isinstance(cls, type) and issubclass(cls, js.Struct) and cls is not js.Struct):
        raise TypeError(f"structs() expected a Struct subclass, got {cls!r}")
    size_option, bindings = split_sizes(sizes)
    options = DrawOptions(size_option, dtypes)
    if is_abstract_class(cls):
        subs = _concrete_subclasses(cls)
        if not subs:
            raise TypeError(
                f"structs(): {cls.__qualname__} is abstract and has no concrete subclass yet; "
                "define one, or pass a concrete class"
            )
        known = {sub: _settable(sub) for sub in subs}
        anywhere = set().union(*known.values())
        unknown = [name for name in overrides if _head(name) not in anywhere]
        unknown += [f for f in bindings.values() if f not in anywhere and strict]
        if unknown:
            raise TypeError(
                f"structs({cls.__qualname__}): {', '.join(map(repr, unknown))} is not a field "
                f"the constructor of any concrete subclass takes; overridable fields are "
                f"{sorted(anywhere)}"
            )
        return st.one_of(
            *(
                _structs(
                    sub,
                    sizes,
                    dtypes,
                    {k: v for k, v in overrides.items() if _head(k) in known[sub]},
                    strict=False,
                )
                for sub in subs
            )
        )
    settable = _settable(cls)
    unknown = [name for name in overrides if _head(name) not in settable]
    if unknown:
        raise TypeError(
            f"structs({cls.__qualname__}): {', '.join(map(repr, unknown))} is not a field the "
            f"constructor takes; overridable fields are {sorted(settable)}"
        )
    plain = {k: v for k, v in overrides.items() if "." not in k}
    by_path = _overrides_by_path(cls, overrides, plain)
    hints = _hints(cls)
    binds_inside = bindings_inside(bindings, settable)
    inside = {
        name: _nested_field(
            cls,
            name,
            hints.get(name),
            binds_inside.get(name, {}),
            by_path.get(name, {}),
            sizes=sizes,
            dtypes=dtypes,
        )
        for name in (*binds_inside, *(n for n in by_path if n not in binds_inside))
        if name not in plain
    }
    extra = _Extra(options, _Nesting(sizes, dtypes), inside)
    plan = Plan(cls, settable, plain, bindings, strict=strict, extra=extra, nested=tuple(inside))
    for name, spec in settable.items():
        if name not in plain and name not in inside:
            annotation = hints.get(name, spec.type)
            _check_hashable_possible(cls, spec, annotation)
            extra.fields[name] = _drawable(cls, spec, annotation)
    extra.upfront = upfront_sizes(cls, _hints, settable, overrides, bindings)
    return instances(plan)


def _head(name: str) -> str:
    return name.partition(".")[0]


def _overrides_by_path(
    cls: type, overrides: Mapping[str, Any], plain: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """The overrides of nested fields (``"initial.cov"``), by the field they go through."""
    by_path: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        head, dot, rest = key.partition(".")
        if not dot:
            continue
        if not rest or not head:
            raise TypeError(
                f"structs({cls.__qualname__}, **{{{key!r}: ...}}): expected a field name or a "
                "path of field names joined by dots ('initial.cov')"
            )
        if head in plain:
            raise TypeError(
                f"structs({cls.__qualname__}): both {head!r} and {key!r} are overridden; the "
                f"strategy given for {head!r} draws the whole nested struct, so drop one of them"
            )
        by_path.setdefault(head, {})[rest] = value
    return by_path


def _nested_field(
    cls: type,
    name: str,
    annotation: Any,
    binds: dict[str, str],
    overrides: dict[str, Any],
    *,
    sizes: Any,
    dtypes: Any,
) -> st.SearchStrategy[Any]:
    """A nested struct field with size bindings or overrides inside it (its named sizes shared)."""
    if not (isinstance(annotation, type) and issubclass(annotation, js.Struct)):
        if binds:
            paths = ", ".join(f"{size!r}: '{name}.{path}'" for size, path in binds.items())
            raise TypeError(
                f"structs({cls.__qualname__}): sizes={{{paths}}} binds a size to a field "
                f"inside {name!r}, which is annotated {_type_name(annotation)}, not a struct "
                "class; bind sizes to int fields of nested struct fields, or of the class itself"
            )
        paths = ", ".join(f"'{name}.{path}'" for path in overrides)
        raise TypeError(
            f"structs({cls.__qualname__}): {paths} overrides a field inside {name!r}, which is "
            f"annotated {_type_name(annotation)}, not a struct class; override {name!r} as a "
            "whole, or annotate it with its struct class"
        )
    nested_sizes = sizes
    if isinstance(sizes, Mapping):
        # The parent's bindings name its own fields; the nested struct gets those inside it.
        nested_sizes = {k: v for k, v in sizes.items() if not isinstance(v, str)}
        nested_sizes.update(binds)
    try:
        return _structs(annotation, nested_sizes, dtypes, overrides, strict=True)
    except TypeError as err:
        if not overrides:
            raise
        raise TypeError(
            f"structs({cls.__qualname__}): in the overrides of fields inside {name!r}: {err}"
        ) from None


def _settable(cls: type) -> dict[str, FieldSpec]:
    """The fields the constructor of ``cls`` takes (not derived), by name."""
    return {n: f for n, f in js.fields(cls).items() if f.init and f.derived is None}


def _never_hashable(annotation: Any) -> bool:
    """Whether no value of ``annotation`` is hashable (lists, dicts, sets, arrays)."""
    origin = typing.get_origin(annotation) or annotation
    if origin is typing.Annotated:
        return _never_hashable(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return all(_never_hashable(a) for a in typing.get_args(annotation))
    return origin in (list, dict, set) or array_request(annotation) is not None


def _check_hashable_possible(cls: type, spec: FieldSpec, annotation: Any) -> None:
    if spec.kind is not FieldKind.STATIC or spec.converter is not None:
        return
    if _never_hashable(annotation):
        raise TypeError(
            f"structs({cls.__qualname__}): static field {spec.name!r} is annotated "
            f"{_type_name(annotation)}, whose values are never hashable, so no instance can be "
            "drawn (static fields are hashed into the tree structure). Annotate it with a "
            "hashable type (tuple[int, ...] instead of list[int], frozenset instead of set), "
            f"give it a converter (converter=tuple), or pass structs(..., {spec.name}=...)"
        )


def _drawable(cls: type, spec: FieldSpec, annotation: Any) -> st.SearchStrategy[Any]:
    """The strategy of a field, built once per ``structs()`` call; refused now if none can draw.

    It reads the named sizes of the instance being drawn when it draws (see
    ``LIVE``), so one strategy serves every draw.
    """
    try:
        strategy = _field_strategy(cls, spec, annotation, LIVE)
        strategy.validate()
    except Exception as err:  # Hypothesis' and NumPy's errors alike: ours names the field
        raise TypeError(
            f"structs({cls.__qualname__}): cannot draw values for field {spec.name!r} annotated "
            f"{_type_name(annotation)} ({type(err).__name__}: {err}); annotate it with a type "
            f"Hypothesis can draw, register a strategy for it (st.register_type_strategy), "
            f"or pass structs(..., {spec.name}=...)"
        ) from None
    return strategy


def _type_name(annotation: Any) -> str:
    return annotation.__qualname__ if isinstance(annotation, type) else repr(annotation)


def _nested(cls: type) -> st.SearchStrategy[Any]:
    """A nested struct field's values: through ``st.from_type``, so registrations count.

    Classes made by ``struct_classes()`` are not registered with Hypothesis.
    """
    if cls.__dict__.get("__jaxstruct_generated__", False):
        return nested_structs(cls)
    return st.from_type(cls)


class _Nesting:
    """The options nested struct fields inherit, with their strategies cached per class."""

    __slots__ = ("cache", "dtypes", "sizes")

    def __init__(self, sizes: Any, dtypes: Any) -> None:
        self.sizes = sizes
        self.dtypes = dtypes
        self.cache: dict[type, st.SearchStrategy[Any]] = {}

    def structs(self, cls: type) -> st.SearchStrategy[Any]:
        found = self.cache.get(cls)
        if found is None:
            found = _structs(cls, self.sizes, self.dtypes, {}, strict=False)
            # Generated classes come and go by the thousand: never kept alive here.
            if not cls.__dict__.get("__jaxstruct_generated__", False):
                self.cache[cls] = found
        return found


class _Extra:
    """What a draw needs besides the plan: options, nesting, strategies of size-binding fields."""

    __slots__ = ("fields", "inside", "nesting", "options", "upfront")

    def __init__(
        self, options: DrawOptions, nesting: _Nesting, inside: dict[str, st.SearchStrategy[Any]]
    ) -> None:
        self.options = options
        self.nesting = nesting
        self.inside = inside
        #: The named sizes drawn before any value (see _upfront).
        self.upfront: tuple[Upfront, ...] = ()
        #: Each field's strategy (those not overridden), built once.
        self.fields: dict[str, st.SearchStrategy[Any]] = {}


#: The options of the instance being drawn, for nested fields resolved through st.from_type.
_NESTING: contextvars.ContextVar[_Nesting | None] = contextvars.ContextVar(
    "jaxstruct_testing_nesting", default=None
)
_PLAIN = _Nesting(None, None)
#: The named sizes of the instance being drawn, which nested structs share.
_SIZES = CURRENT_SIZES


def _bind_paths(value: Any, paths: Mapping[str, str], sizes: dict[str, Any]) -> None:
    """Bind named sizes to the ints found at ``paths`` inside an override's drawn ``value``."""
    for size, path in paths.items():
        found = value
        for part in path.split("."):
            found = getattr(found, part, None)
        if isinstance(found, int) and not isinstance(found, bool):
            sizes.setdefault(size, found)


@st.composite
def nested_structs(draw: Callable[..., Any], cls: type) -> Any:
    """Instances of ``cls`` drawn with the options of the enclosing ``structs()`` draw, if any.

    What ``st.from_type(cls)`` resolves to, so a nested field drawn through
    ``st.from_type`` keeps the ``sizes=`` and ``dtypes=`` of its parent.
    """
    return draw((_NESTING.get() or _PLAIN).structs(cls))


def _array_dims(annotation: Any) -> tuple[Any, ...] | None:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    request = array_request(annotation)
    return None if request is None else request.dims


def _dependency_value(values: Mapping[str, Any], spec: FieldSpec) -> Any:
    if spec.name in values:
        return values[spec.name]
    return spec.make_default()  # the field keeps its default


def _draw_upfront(draw: Callable[..., Any], upfront: tuple[Upfront, ...], sizes: SizeTable) -> None:
    """Draw the named sizes first: the shrinker lowers each before any value (see _upfront)."""
    for name, least, variadic in upfront:
        if name in sizes:
            continue
        if variadic:
            sizes[name] = tuple(draw(st.lists(sizes.options.size(name), max_size=2)))
        else:
            sizes.minimums[name] = max(least, sizes.minimums.get(name, 0))
            sizes.draw_size(name, draw)


@st.composite
def instances(draw: Callable[..., Any], plan: Plan) -> Any:
    """Draw one instance as ``plan`` says (what ``structs()`` returns)."""
    extra: _Extra = plan.extra
    options = extra.options
    cls = plan.cls
    hints = _hints(cls)
    top = _NESTING.get() is None
    # Named sizes are shared with the nested structs drawn from annotations.
    shared = None if top else _SIZES.get()
    sizes = shared if shared is not None else SizeTable(options)
    if shared is None:
        _draw_upfront(draw, extra.upfront, sizes)
    values: dict[str, Any] = {}
    token = _NESTING.set(extra.nesting)
    sizes_token = _SIZES.set(sizes)
    field_token = None
    try:
        for name in plan.order:
            if field_token is not None:
                drawing_field.reset(field_token)
            field_token = drawing_field.set((cls.__qualname__, name))
            spec = plan.settable[name]
            annotation = hints.get(name, spec.type)
            override = plan.overrides.get(name)
            if override is not None:
                if name in plan.depends:
                    args = {
                        p: _dependency_value(values, plan.settable[p]) for p in plan.depends[name]
                    }
                    override = override(**args)
                    if not isinstance(override, st.SearchStrategy):
                        raise TypeError(
                            f"structs({cls.__qualname__}, {name}=...): the override returned "
                            f"{type(override).__name__} {override!r}, expected a strategy"
                        )
                # An override's own structs() draw their own sizes.
                inner = _SIZES.set(None)
                try:
                    value = values[name] = draw(override)
                finally:
                    _SIZES.reset(inner)
                _bind_paths(value, plan.bound_inside.get(name, {}), sizes)
            elif name in extra.inside:
                values[name] = draw(extra.inside[name])
                continue
            elif name in plan.bound:
                size = plan.bound[name]
                # A size an enclosing struct already drew is this field's value.
                drawn = st.just(sizes[size]) if size in sizes else options.size(size)
                value = values[name] = draw(narrowed(spec, drawn, int, cls=cls))
            elif spec.has_default and draw(st.booleans()):
                continue
            else:
                values[name] = draw(extra.fields[name])
                continue
            # A value given by the user (or bound to a size) binds the sizes it shows.
            if name in plan.bound and isinstance(value, int):
                sizes.setdefault(plan.bound[name], value)
            shape = getattr(value, "shape", None)
            if isinstance(shape, tuple):
                bind_sizes(_array_dims(annotation), shape, sizes)
    finally:
        if field_token is not None:
            drawing_field.reset(field_token)
        _SIZES.reset(sizes_token)
        _NESTING.reset(token)
    record_attempt(cls)
    try:
        # A hand-written __init__ has its own signature: build from field values.
        instance = js.build(cls, values) if js.has_custom_init(cls) else cls(**values)
    except Exception as err:
        why = describe_refusal(cls, err)
        if why is None:
            raise  # a bug of the class under test: the user's own traceback fails the test
        # The class refused the draw on purpose: discard it, saying who and why.
        event(f"jaxstruct: {cls.__qualname__} refused a draw: {why}")
        debug_report(f"jaxstruct: {cls.__qualname__} refused a draw: {why}")
        record_refusal(cls, why)
        reject()
    if top:
        note(Shown(instance))  # the failing example's arrays, by value (nested ones inside)
    return instance
