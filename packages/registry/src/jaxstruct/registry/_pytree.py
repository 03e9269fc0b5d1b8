"""Registration of foreign classes as JAX pytrees, and the table of specs.

Every class that jaxstruct knows how to flatten has a :class:`PytreeSpec` here:
``Struct`` subclasses (added by ``jaxstruct.core``), classes registered with
:func:`register_pytree_type`, and attribute-backed classes registered with
:func:`register_attrs_type`. The I/O layer reads these specs to store and
rebuild instances.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from ._errors import ClassReferenceError, RegistrationError
from ._refs import register_class_ref, resolve_class

__all__ = [
    "PytreeSpec",
    "is_registered_pytree_type",
    "register_attrs_type",
    "register_pytree_type",
    "registered_pytree_types",
    "resolve_pytree_spec",
]

T = TypeVar("T", bound=type)

_specs: dict[type, PytreeSpec] = {}
_lock = threading.RLock()
_listeners: list[Callable[[PytreeSpec], None]] = []


class PytreeSpec:
    """How one class is flattened, rebuilt and (optionally) serialised.

    Attributes:
        cls: the registered class.
        kind: ``"struct"``, ``"custom"`` (:func:`register_pytree_type`) or
            ``"attrs"`` (:func:`register_attrs_type`).
        flatten: ``obj -> (children, aux)``.
        unflatten: ``(aux, children) -> obj``.
        flatten_with_keys: ``obj -> ([(key, child), ...], aux)`` or ``None``.
        serializer: ``obj -> JSON-safe payload`` replacing the aux data on disk, or ``None``.
        deserializer: ``(payload, children) -> obj``, or ``None``.
        node_fields: attribute names of the children (struct and attrs kinds).
        static_fields: attribute names kept as aux data (struct and attrs kinds).
    """

    __slots__ = (
        "cls",
        "deserializer",
        "flatten",
        "flatten_with_keys",
        "kind",
        "node_fields",
        "serializer",
        "static_fields",
        "unflatten",
    )

    def __init__(
        self,
        cls: type,
        *,
        kind: str,
        flatten: Callable[[Any], tuple[Iterable[Any], Any]],
        unflatten: Callable[[Any, Iterable[Any]], Any],
        flatten_with_keys: Callable[[Any], tuple[Iterable[tuple[Any, Any]], Any]] | None = None,
        serializer: Callable[[Any], Any] | None = None,
        deserializer: Callable[[Any, Sequence[Any]], Any] | None = None,
        node_fields: tuple[str, ...] = (),
        static_fields: tuple[str, ...] = (),
    ) -> None:
        self.cls = cls
        self.kind = kind
        self.flatten = flatten
        self.unflatten = unflatten
        self.flatten_with_keys = flatten_with_keys
        self.serializer = serializer
        self.deserializer = deserializer
        self.node_fields = node_fields
        self.static_fields = static_fields

    def __repr__(self) -> str:
        return f"PytreeSpec({self.cls.__module__}.{self.cls.__qualname__}, kind={self.kind!r})"


def add_spec(spec: PytreeSpec) -> None:
    """Record ``spec`` (JAX registration is the caller's job) and cache its class reference."""
    with _lock:
        _specs[spec.cls] = spec
        register_class_ref(spec.cls)
        listeners = tuple(_listeners)
    for listener in listeners:
        listener(spec)


def add_registration_listener(listener: Callable[[PytreeSpec], None]) -> None:
    """Call ``listener(spec)`` for every spec registered now and later (used by integrations)."""
    with _lock:
        _listeners.append(listener)
        current = tuple(_specs.values())
    for spec in current:
        listener(spec)


def registered_pytree_types() -> tuple[type, ...]:
    """Return every class that has a spec, in registration order."""
    with _lock:
        return tuple(_specs)


def _check_callable(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not callable(value):
        raise RegistrationError(f"{name} must be callable, got {type(value).__name__} {value!r}")


def register_pytree_type(
    cls: T,
    *,
    flatten: Callable[[Any], tuple[Iterable[Any], Any]],
    unflatten: Callable[[Any, Iterable[Any]], Any],
    flatten_with_keys: Callable[[Any], tuple[Iterable[tuple[Any, Any]], Any]] | None = None,
    serializer: Callable[[Any], Any] | None = None,
    deserializer: Callable[[Any, Sequence[Any]], Any] | None = None,
) -> T:
    """Register an existing class as a JAX pytree with full control over flattening.

    Registering the same class again replaces its functions (JAX keeps calling
    through to the newest ones), so re-running a notebook cell works.

    Args:
        cls: the class to register.
        flatten: ``obj -> (children, aux)``; ``aux`` must be hashable.
        unflatten: ``(aux, children) -> obj``.
        flatten_with_keys: optional ``obj -> ([(key, child), ...], aux)`` giving
            key paths for ``tree_flatten_with_path``.
        serializer: optional ``obj -> payload`` storing a JSON-safe payload
            instead of the raw aux data when exporting.
        deserializer: optional ``(payload, children) -> obj``, the inverse.

    Returns:
        ``cls`` itself, so this can be used through :func:`functools.partial` as a decorator.

    Raises:
        RegistrationError: an argument is not callable, only one of
            ``serializer``/``deserializer`` is given, or ``cls`` was registered
            with JAX by someone else.

    Example:
        >>> import jax
        >>> class Pair:
        ...     def __init__(self, a, b):
        ...         self.a, self.b = a, b
        >>> _ = register_pytree_type(
        ...     Pair,
        ...     flatten=lambda p: ((p.a, p.b), None),
        ...     unflatten=lambda aux, ch: Pair(*ch),
        ... )
        >>> jax.tree_util.tree_leaves(Pair(1, 2))
        [1, 2]
    """
    if not isinstance(cls, type):
        raise RegistrationError(f"register_pytree_type() expected a class, got {cls!r}")
    _check_callable("flatten", flatten)
    _check_callable("unflatten", unflatten)
    _check_callable("flatten_with_keys", flatten_with_keys, optional=True)
    _check_callable("serializer", serializer, optional=True)
    _check_callable("deserializer", deserializer, optional=True)
    if (serializer is None) != (deserializer is None):
        raise RegistrationError(
            f"register_pytree_type({cls.__qualname__}): serializer and deserializer go together; "
            "pass both or neither"
        )
    spec = PytreeSpec(
        cls,
        kind="custom",
        flatten=flatten,
        unflatten=unflatten,
        flatten_with_keys=flatten_with_keys,
        serializer=serializer,
        deserializer=deserializer,
    )
    _register_with_jax(spec)
    return cls


def _register_with_jax(spec: PytreeSpec) -> None:
    import jax  # here, not at the top: reading a checkpoint's manifest needs no JAX

    cls = spec.cls
    with _lock:
        if cls not in _specs:
            # JAX keeps the first functions it is given; route them through the
            # table so that a later registration of the same class takes effect.
            def flat(obj: Any) -> tuple[Iterable[Any], Any]:
                return _specs[cls].flatten(obj)

            def unflat(aux: Any, children: Iterable[Any]) -> Any:
                return _specs[cls].unflatten(aux, children)

            def flat_keys(obj: Any) -> tuple[Iterable[tuple[Any, Any]], Any]:
                current = _specs[cls]
                if current.flatten_with_keys is not None:
                    return current.flatten_with_keys(obj)
                children, aux = current.flatten(obj)
                return [
                    (jax.tree_util.FlattenedIndexKey(i), c) for i, c in enumerate(children)
                ], aux

            try:
                jax.tree_util.register_pytree_with_keys(cls, flat_keys, unflat, flat)
            except ValueError as err:
                raise RegistrationError(
                    f"cannot register {cls.__qualname__!r}: it is already a JAX pytree type "
                    f"registered outside jaxstruct ({err})"
                ) from None
        add_spec(spec)


def register_attrs_type(
    cls: T,
    *,
    node_fields: Sequence[str],
    static_fields: Sequence[str] = (),
    constructor: Callable[[Mapping[str, Any]], Any] | None = None,
) -> T:
    """Register an attribute-backed class as a pytree from its attribute names.

    Node attributes become children (with ``GetAttrKey`` paths), static ones aux
    data. Instances are rebuilt with ``constructor(values)`` when given,
    otherwise without calling ``__init__`` (the attributes are set directly), so
    rebuilding never runs the class's own checks on tracers.

    Args:
        cls: the class to register.
        node_fields: names of attributes that are pytree children.
        static_fields: names of attributes kept as hashable aux data.
        constructor: optional ``mapping -> instance`` used to rebuild.

    Returns:
        ``cls`` itself.

    Raises:
        RegistrationError: a name is not a string, is listed twice, or the
            arguments are otherwise malformed.

    Example:
        >>> import jax
        >>> class Edge:
        ...     def __init__(self, flux, source):
        ...         self.flux, self.source = flux, source
        >>> _ = register_attrs_type(Edge, node_fields=("flux",), static_fields=("source",))
        >>> jax.tree_util.tree_leaves(Edge(1.5, source=0))
        [1.5]
    """
    if not isinstance(cls, type):
        raise RegistrationError(f"register_attrs_type() expected a class, got {cls!r}")
    nodes = _names("node_fields", node_fields)
    statics = _names("static_fields", static_fields)
    if overlap := set(nodes) & set(statics):
        raise RegistrationError(
            f"register_attrs_type({cls.__qualname__}): {sorted(overlap)} listed as both node "
            "and static fields; list each attribute once"
        )
    _check_callable("constructor", constructor, optional=True)
    get_nodes = _tuple_getter(nodes)
    get_statics = _tuple_getter(statics)
    import jax

    keys = tuple(jax.tree_util.GetAttrKey(n) for n in nodes)
    new: Any = cls.__new__
    setattr_ = object.__setattr__

    def flatten(obj: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return get_nodes(obj), get_statics(obj)

    def flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], tuple[Any, ...]]:
        return list(zip(keys, get_nodes(obj), strict=True)), get_statics(obj)

    def unflatten(aux: Iterable[Any], children: Iterable[Any]) -> Any:
        values = dict(zip(nodes, children, strict=True))
        values.update(zip(statics, aux, strict=True))
        if constructor is not None:
            return constructor(values)
        obj = new(cls)
        for name, value in values.items():
            setattr_(obj, name, value)
        return obj

    def serializer(obj: Any) -> dict[str, Any]:
        return dict(zip(statics, get_statics(obj), strict=True))

    def deserializer(payload: Mapping[str, Any], children: Sequence[Any]) -> Any:
        return unflatten(tuple(payload[name] for name in statics), children)

    spec = PytreeSpec(
        cls,
        kind="attrs",
        flatten=flatten,
        unflatten=unflatten,
        flatten_with_keys=flatten_with_keys,
        serializer=serializer,
        deserializer=deserializer,
        node_fields=nodes,
        static_fields=statics,
    )
    _register_with_jax(spec)
    return cls


def _names(what: str, names: Sequence[str]) -> tuple[str, ...]:
    if isinstance(names, str):
        raise RegistrationError(f"{what} must be a sequence of names, got the string {names!r}")
    out = tuple(names)
    for name in out:
        if not isinstance(name, str) or not name.isidentifier():
            raise RegistrationError(f"{what} must hold attribute names, got {name!r}")
    if len(set(out)) != len(out):
        raise RegistrationError(f"{what} lists a name twice: {list(out)}")
    return out


def _tuple_getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        (name,) = names
        return lambda obj: (getattr(obj, name),)
    return operator.attrgetter(*names)


def is_registered_pytree_type(cls: type) -> bool:
    """Return whether jaxstruct knows how to flatten ``cls`` (a Struct or a registered type).

    Example:
        >>> is_registered_pytree_type(int)
        False
    """
    return cls in _specs


def resolve_pytree_spec(cls_or_ref: type | str, *, allow_import: bool = True) -> PytreeSpec:
    """Return the :class:`PytreeSpec` of a class, given the class or its reference.

    Args:
        cls_or_ref: the class, or its ``"module:QualName"`` reference.
        allow_import: passed to :func:`resolve_class` for references.

    Raises:
        ClassReferenceError: the reference cannot be resolved, or the class is
            not registered.

    Example:
        >>> resolve_pytree_spec(int)
        Traceback (most recent call last):
        ...
        jaxstruct.registry._errors.ClassReferenceError: ...
    """
    cls = (
        resolve_class(cls_or_ref, allow_import=allow_import)
        if isinstance(cls_or_ref, str)
        else cls_or_ref
    )
    spec = _specs.get(cls)
    if spec is None:
        name = getattr(cls, "__qualname__", repr(cls))
        raise ClassReferenceError(
            f"{name!r} is not a registered pytree type; subclass jaxstruct.core.Struct, or "
            "register it with register_pytree_type() or register_attrs_type()"
        )
    return spec
