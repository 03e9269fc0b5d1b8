"""The :class:`Struct` base class: frozen instances, ``replace``, introspection, I/O methods."""

# pyright: reportRedeclaration=false
# (``replace`` is declared twice on purpose: the method, then its typing-only signature.)

from __future__ import annotations

import importlib
import sys
from collections import OrderedDict
from collections.abc import Callable
from types import MethodType
from typing import TYPE_CHECKING, Any, ClassVar, ParamSpec, Protocol, TypeVar

import jax

from ._cache import FlatForm, KeyedForm, refresh
from ._codegen import generate_replace, set_generic_replace
from ._compare import TracedLeaf, hash_fields, traced_comparison_message, values_equal
from ._dataclass import DataclassFields, DataclassParams
from ._display import PrettyHook, rich_fields
from ._errors import (
    FrozenStructError,
    MissingDistributionError,
    TracedComparisonError,
    ValidationError,
)
from ._fields import MISSING, FieldKind, FieldSpec
from ._layout import Layout
from ._lifecycle import (
    SAFE_STATIC_TYPES,
    assign_arguments,
    bound_method_message,
    building,
    check_static,
    finish,
)
from ._meta import StructMeta
from ._repr import struct_repr

if TYPE_CHECKING:
    # Only for the annotation of Struct.select. At run time _struct never
    # imports _select, which builds on Struct: Struct.select finds the selection
    # layer by its module name when it is called (_selection_layer).
    from ._select import Selection

__all__ = ["Struct"]

S = TypeVar("S", bound="Struct")
_P = ParamSpec("_P")
_R_co = TypeVar("_R_co", covariant=True)


class _Replaceable(Protocol[_P, _R_co]):
    """Typing only: an object with a ``__replace__`` (what ``replace`` is typed from)."""

    def __replace__(self, /, *args: _P.args, **kwargs: _P.kwargs) -> _R_co: ...


_osa = object.__setattr__
_new = object.__new__


def _io() -> Any:
    try:
        module = importlib.import_module("jaxstruct.io")
    except ModuleNotFoundError as err:
        if err.name not in ("jaxstruct.io", "jaxstruct"):
            raise
        module = None
    if module is None or not hasattr(module, "export"):
        raise MissingDistributionError(
            "serialisation (to_state_dict, from_state_dict, export, load) needs the "
            "'jaxstruct-io' distribution; install it with: pip install jaxstruct-io"
        ) from None
    return module


def _expect(cls: type, obj: Any, what: str) -> Any:
    if cls is not Struct and not isinstance(obj, cls):
        from jaxstruct.registry import SerializationError, name_classes

        # Classes of one name (every algorithm's "State") are named by module.
        got, want = name_classes(type(obj), cls)
        if got == want:
            # Two class objects under one reference: a class statement run again.
            raise SerializationError(
                f"{what} holds a {got} of another definition than this {want} (its module "
                "was reloaded or its class statement ran again since); load it with "
                "Struct.load(), or pass load_cls= to build this class from its fields"
            )
        raise SerializationError(
            f"{what} holds a {got}, not a {want}; load it with {got}.load() or "
            f"Struct.load(), or pass load_cls= to build a {want} from its fields"
        )
    return obj


class Struct(metaclass=StructMeta):
    """Base class of immutable JAX pytree containers.

    Subclasses declare fields with annotations (and :func:`field` for options).
    Each subclass is a registered pytree: node fields are children, static
    fields aux data, opaque fields invisible to JAX. Instances are frozen after
    construction; use :meth:`replace` to derive new ones.

    Example:
        >>> import jax.numpy as jnp
        >>> import jaxstruct.core as js
        >>> class TrainState(js.Struct):
        ...     params: object
        ...     step: int = js.field(static=True, default=0)
        >>> s = TrainState(params=jnp.ones(3))
        >>> s
        TrainState(params=Array([1., 1., 1.], dtype=float32), step=0)
        >>> s.replace(step=1).step
        1
    """

    # ClassVar: dataclass_transform would otherwise make it a constructor parameter.
    __struct_layout__: ClassVar[Layout]

    # The flattened forms JAX reads, built per instance on first use (see _cache).
    _jaxstruct_flat = FlatForm()
    _jaxstruct_keyed = KeyedForm()

    # The stdlib dataclass protocol (dataclasses.fields, replace, asdict, ...),
    # built per class on first use (see _dataclass).
    __dataclass_fields__: ClassVar[Any] = DataclassFields()
    __dataclass_params__: ClassVar[Any] = DataclassParams()

    def __init__(self, /, *args: Any, **kwargs: Any) -> None:
        """Assign fields from arguments for any struct class (used by ``super().__init__``)."""
        layout = type(self).__dict__.get("__struct_layout__") or getattr(
            type(self), "__struct_layout__", None
        )
        if layout is None:
            if args or kwargs:
                raise TypeError("Struct() takes no arguments; subclass it and declare fields")
            return
        if id(self) in building():
            # A user's __init__ calling super().__init__(...) (the cooperative
            # pattern of mixins): assign what is given, keep what is assigned.
            assign_arguments(self, layout, args, kwargs, keep_assigned=True)
            return
        finish(self, layout, initvars=assign_arguments(self, layout, args, kwargs))

    __init__._jaxstruct_generated = True  # type: ignore[attr-defined]

    # -- immutability -----------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if id(self) in building():
            layout = type(self).__struct_layout__
            spec = layout.by_name.get(name)
            if spec is None:
                raise FrozenStructError(
                    f"{type(self).__qualname__} has no field {name!r}; only declared fields can "
                    f"be assigned. Declare it, e.g. {name}: object = field(pytree=False, "
                    "init=False, default=None)"
                )
            if spec.converter is not None:
                value = layout.convert(self, spec, value)
            if type(value) is MethodType and value.__self__ is self:
                raise ValidationError(
                    bound_method_message(type(self), name, value.__func__.__name__)
                )
            # The flattened form is rebuilt when construction finishes.
            _osa(self, name, value)
            return
        if name == "__orig_class__":
            # Set by ``A[int](...)`` on a generic struct (typing does it after
            # __init__); it is no field, so JAX and == never see it.
            _osa(self, name, value)
            return
        raise FrozenStructError(
            f"cannot assign {name!r}: {type(self).__qualname__} instances are frozen; "
            f"use .replace({name}=...) to get an updated copy"
        )

    def __delattr__(self, name: str) -> None:
        raise FrozenStructError(
            f"cannot delete {name!r}: {type(self).__qualname__} instances are frozen"
        )

    # -- updating ---------------------------------------------------------------------
    def replace(self: S, /, **changes: Any) -> S:
        """Return a copy with some fields changed, running the lifecycle again.

        Converters run on the changed values; derived fields, ``__post_init__``,
        validators and ``__check_init__`` run as in construction, except that
        the validators (and static checks) of fields still holding this
        instance's values are not run again. The user's own
        ``__init__`` is not called. ``InitVar`` arguments are passed like fields
        (``replace(x=1, flag=True)``) and reach ``__post_init__``; those not
        given take their defaults, and one without a default must be given.

        Raises:
            TypeError: a name is not a field, or is a derived field.
            ValidationError: a validator or static-field check fails.
            TracedCheckError: a check read the value of a traced array (under ``jit``).

        Example:
            >>> import jaxstruct.core as js
            >>> class P(js.Struct):
            ...     x: int
            >>> P(x=1).replace(x=2)
            P(x=2)
        """
        cls = type(self)
        layout = cls.__struct_layout__
        if not layout.has_hooks and _replace_is_ours(cls):
            # Compile the keyword-only replace of this class and use it from now on.
            return generate_replace(cls)(self, **changes)
        by_name = layout.by_name
        initvars: tuple[Any, ...] = ()
        if layout.initvars:
            initvars = _initvar_values(cls, layout, changes)
        for name in changes:
            spec = by_name.get(name)
            if spec is None:
                raise TypeError(
                    f"{cls.__qualname__}.replace() got an unknown field {name!r}; "
                    f"fields are {list(by_name)}"
                )
            if spec.derived is not None:
                raise TypeError(
                    f"{cls.__qualname__}.replace(): {name!r} is a derived field; change the "
                    "fields it is computed from instead"
                )
        new = _new(cls)
        for spec in layout.fields:
            name = spec.name
            if name in changes:
                value = changes[name]
                if spec.converter is not None:
                    value = layout.convert(new, spec, value)
                _osa(new, name, value)
            elif spec.derived is None:
                value = getattr(self, name, MISSING)
                if value is not MISSING:
                    _osa(new, name, value)
        if layout.has_hooks:
            finish(new, layout, initvars=initvars, source=self)
        else:
            for name in layout.static_checked:
                if name in changes:
                    value = getattr(new, name)
                    if type(value) not in SAFE_STATIC_TYPES:
                        check_static(cls, name, value)
        return new

    if TYPE_CHECKING:
        # For pyright only: ``replace`` takes what ``__replace__`` takes, which pyright
        # synthesises per class (pythonVersion >= 3.13) with each field as an optional
        # keyword. mypy reads the method above; jaxstruct.core.mypy_plugin types it.
        @property
        def replace(self: _Replaceable[_P, _R_co]) -> Callable[_P, _R_co]: ...

    def __replace__(self: S, /, **changes: Any) -> S:
        """Support ``copy.replace(obj, **changes)`` (Python 3.13+): same as :meth:`replace`."""
        return self.replace(**changes)

    def rederive(self: S) -> S:
        """Recompute every derived field in place (after an in-place change of a mutable field).

        Returns the instance itself.

        Example:
            >>> import jaxstruct.core as js
            >>> class Bag(js.Struct):
            ...     items: list
            ...     size: int = js.field(
            ...         static=True, init=False, derived=lambda self: len(self.items)
            ...     )
            >>> bag = Bag(items=[1, 2])
            >>> bag.items.append(3)
            >>> bag.rederive().size
            3
        """
        layout = type(self).__struct_layout__
        if layout.derived:
            from ._lifecycle import compute_derived

            compute_derived(self, layout)
            refresh(self)
        return self

    # -- protocol ---------------------------------------------------------------------
    def __repr__(self) -> str:
        # One line when it fits 80 columns, broken with indentation otherwise (see _repr).
        return struct_repr(self)

    __repr__._jaxstruct_repr = True  # type: ignore[attr-defined]

    # IPython/Jupyter display: the multi-line pformat form.
    _repr_pretty_ = PrettyHook()

    def __rich_repr__(self) -> Any:
        """rich display: fields by name, every array as its summary (``float32[3]``)."""
        return rich_fields(self)

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        """treescope display: fields one per line, static and opaque ones marked."""
        from ._treescope import render_struct

        return render_struct(self, path, subtree_renderer)

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if type(other) is not type(self):
            return NotImplemented
        for name in type(self).__struct_layout__.compare_names:
            try:
                if not values_equal(getattr(self, name), getattr(other, name)):
                    return False
            except TracedLeaf:
                raise TracedComparisonError(traced_comparison_message(type(self), name)) from None
        return True

    def __hash__(self) -> int:
        return hash_fields(self, type(self).__struct_layout__.compare_names)

    # -- introspection ----------------------------------------------------------------
    @classmethod
    def fields(cls) -> OrderedDict[str, FieldSpec]:
        """Return an ordered mapping of field name to :class:`FieldSpec`."""
        return OrderedDict((f.name, f) for f in cls.__struct_layout__.fields)

    @classmethod
    def node_fields(cls) -> tuple[str, ...]:
        """Return the names of node (pytree child) fields."""
        return cls.__struct_layout__.node_names

    @classmethod
    def static_fields(cls) -> tuple[str, ...]:
        """Return the names of static (aux data) fields."""
        return cls.__struct_layout__.static_names

    @classmethod
    def opaque_fields(cls) -> tuple[str, ...]:
        """Return the names of opaque (invisible to JAX) fields."""
        return cls.__struct_layout__.opaque_names

    @classmethod
    def derived_fields(cls) -> tuple[str, ...]:
        """Return the names of derived fields."""
        return tuple(f.name for f in cls.__struct_layout__.derived)

    def tree_size(self) -> int:
        """Return the number of pytree leaves (``len(jax.tree_util.tree_leaves(self))``)."""
        return len(jax.tree_util.tree_leaves(self))

    def to_dict(self, *, recursive: bool = False, include_opaque: bool = True) -> dict[str, Any]:
        """Return the fields as a plain dict (for logging and debugging, not persistence).

        Args:
            recursive: also convert nested structs (inside lists, tuples and dicts too).
            include_opaque: keep opaque fields.
        """
        out: dict[str, Any] = {}
        for spec in type(self).__struct_layout__.fields:
            if not include_opaque and spec.kind is FieldKind.OPAQUE:
                continue
            value = getattr(self, spec.name, MISSING)
            if recursive:
                value = _plain(value, include_opaque)
            out[spec.name] = value
        return out

    # -- serialisation (implemented by the jaxstruct-io distribution) ----------------
    def to_state_dict(self) -> dict[str, Any]:
        """Return a portable in-memory payload (needs ``jaxstruct-io``)."""
        return _io().to_state_dict(self)

    @classmethod
    def from_state_dict(cls: type[S], payload: Any, **kwargs: Any) -> S:
        """Rebuild an instance from :meth:`to_state_dict`'s payload (needs ``jaxstruct-io``)."""
        return _expect(cls, _io().from_state_dict(payload, **kwargs), "the payload")

    def export(self, path: Any, **kwargs: Any) -> Any:
        """Write a checkpoint directory, or a ``.zip`` archive (needs ``jaxstruct-io``)."""
        return _io().export(self, path, **kwargs)

    @classmethod
    def load(cls: type[S], path: Any, **kwargs: Any) -> S:
        """Read a checkpoint written by :meth:`export` (needs ``jaxstruct-io``)."""
        return _expect(cls, _io().load(path, **kwargs), f"checkpoint {str(path)!r}")

    # -- selection --------------------------------------------------------------------
    def select(self: S) -> Selection[S]:
        """Return a :class:`Selection` holding this instance (same as ``select(self)``).

        Example:
            >>> import jaxstruct.core as js
            >>> class P(js.Struct):
            ...     a: int
            ...     b: int
            >>> P(a=1, b=2).select().at(lambda p: p.b).apply(lambda v: v * 10)
            P(a=1, b=20)
        """
        return _selection_layer().select(self)


set_generic_replace(Struct.replace)

#: The selection layer: it builds on Struct (a Selection is a struct), so Struct reaches
#: it by name, when ``select`` is called, instead of importing it (nothing is installed
#: into this module at import time, and nothing runs before the first call).
_SELECTION_LAYER = "jaxstruct.core._select"


def _selection_layer() -> Any:
    """The ``jaxstruct.core._select`` package (imported with jaxstruct.core; else now)."""
    found = sys.modules.get(_SELECTION_LAYER)
    return found if found is not None else importlib.import_module(_SELECTION_LAYER)


def _initvar_values(cls: type, layout: Layout, changes: dict[str, Any]) -> tuple[Any, ...]:
    """Take the InitVar arguments out of ``changes`` (defaults for those not given)."""
    values: list[Any] = []
    for spec in layout.initvars:
        if spec.name in changes:
            values.append(changes.pop(spec.name))
        elif spec.has_default:
            values.append(spec.make_default())
        else:
            raise TypeError(
                f"{cls.__qualname__}.replace() needs the InitVar {spec.name!r}, which has no "
                f"default: pass it ({spec.name}=...) as you would to the constructor"
            )
    return tuple(values)


def _replace_is_ours(cls: type) -> bool:
    """Whether ``cls.replace`` is ``Struct.replace`` or one we generated (not a user's)."""
    if "replace" in cls.__dict__:
        return False
    method = getattr(cls, "replace", None)
    return method is Struct.replace or getattr(method, "_jaxstruct_fast_replace", False)


def _plain(value: Any, include_opaque: bool) -> Any:
    if isinstance(value, Struct):
        return value.to_dict(recursive=True, include_opaque=include_opaque)
    kind = type(value)
    if kind is list:
        return [_plain(v, include_opaque) for v in value]
    if kind is tuple:
        return tuple(_plain(v, include_opaque) for v in value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return kind(*(_plain(v, include_opaque) for v in value))
    if isinstance(value, dict) and kind is dict:
        mapping: dict[Any, Any] = value
        return {k: _plain(v, include_opaque) for k, v in mapping.items()}
    return value
