"""Field declarations: :func:`field`, :class:`FieldSpec` and :class:`FieldKind`."""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar, overload

__all__ = ["MISSING", "FieldKind", "FieldSpec", "field", "from_dataclasses_field"]

T = TypeVar("T")


class _MissingType:
    """Sentinel for "no value given"; falsy, a singleton, and readable in reprs."""

    __slots__ = ()
    _instance: _MissingType | None = None

    def __new__(cls) -> _MissingType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "MISSING"


MISSING: Any = _MissingType()


class FieldKind(enum.Enum):
    """How a field takes part in JAX pytree traversal."""

    NODE = "node"
    """A pytree child: traced by ``jit``, differentiated by ``grad``, batched by ``vmap``."""
    STATIC = "static"
    """Auxiliary data: hashed into the tree structure; a change means a new ``jit`` trace."""
    OPAQUE = "opaque"
    """Invisible to JAX: carried through flatten/unflatten by identity, not serialised."""


class FieldSpec:
    """The declaration of one field, as returned by :func:`field` and listed by ``fields()``.

    Attributes:
        name: the field name (set when the class is created).
        type: the annotation, as written (strings stay strings).
        kind: the :class:`FieldKind`.
        default: the default value, or ``MISSING``.
        default_factory: zero-argument callable producing a default, or ``MISSING``.
        init: whether the constructor takes this field.
        repr: whether ``repr()`` shows it.
        compare: whether ``==`` and ``hash()`` use it.
        serialize: the explicit serialisation override (``None`` = by kind).
        kw_only: whether the constructor takes it by keyword only.
        doc: the per-field docstring.
        metadata: a read-only mapping for tools.
        converter: normalisation hook, or ``None``.
        validators: tuple of validation hooks (possibly empty): the declared ones,
            then the constraints written in the annotation (``Annotated[T, finite]``).
        annotated: the constraints taken from the annotation (also in ``validators``).
        derived: callable computing the value, or ``None``.
        override: whether this declaration deliberately replaces an inherited field.
    """

    __slots__ = (
        "_problems",
        "annotated",
        "compare",
        "converter",
        "default",
        "default_factory",
        "derived",
        "doc",
        "init",
        "initvar",
        "kind",
        "kw_only",
        "metadata",
        "name",
        "override",
        "owner",
        "repr",
        "serialize",
        "type",
        "validators",
    )

    def __init__(
        self,
        *,
        static: bool = False,
        pytree: bool = True,
        default: Any = MISSING,
        default_factory: Any = MISSING,
        init: bool = True,
        repr: bool = True,
        compare: bool = True,
        serialize: bool | None = None,
        kw_only: bool = False,
        doc: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        converter: Callable[..., Any] | None = None,
        validator: Callable[..., Any] | Iterable[Callable[..., Any]] | None = None,
        derived: Callable[..., Any] | None = None,
        override: bool = False,
    ) -> None:
        problems: list[str] = []
        if static and not pytree:
            problems.append(
                "static=True and pytree=False both given; a field is either static aux data "
                "(static=True) or invisible to JAX (pytree=False), drop one of them"
            )
        self.kind = (
            FieldKind.OPAQUE if not pytree else FieldKind.STATIC if static else FieldKind.NODE
        )
        if default is not MISSING and default_factory is not MISSING:
            problems.append(
                "both default and default_factory are given; keep default= for an immutable "
                "value or default_factory= for a fresh value per instance"
            )
        if default_factory is not MISSING and not callable(default_factory):
            problems.append(f"default_factory must be callable, got {default_factory!r}")
        if converter is not None and not callable(converter):
            problems.append(f"converter must be callable, got {converter!r}")
        if validator is None:
            validators: tuple[Callable[..., Any], ...] = ()
        elif callable(validator):
            validators = (validator,)
        else:
            validators = tuple(validator)
        for v in validators:
            if not callable(v):
                problems.append(f"validators must be callable, got {v!r}")
        if derived is not None:
            if not callable(derived):
                problems.append(f"derived must be callable, got {derived!r}")
            if self.kind is FieldKind.NODE:
                problems.append(
                    "a derived field cannot be a node field (JAX would trace a value that is "
                    "recomputed from other fields); declare it static=True or pytree=False"
                )
            if init:
                problems.append(
                    "a derived field is computed, never passed to the constructor; add init=False"
                )
            if default is not MISSING or default_factory is not MISSING:
                problems.append("a derived field takes no default; drop default/default_factory")
            if serialize:
                problems.append(
                    "a derived field is recomputed on load and never stored; drop serialize=True"
                )
        self.name: str = ""
        self.type: Any = None
        self.owner: type | None = None
        self.default = default
        self.default_factory = default_factory
        self.init = bool(init)
        self.repr = bool(repr)
        self.compare = bool(compare)
        self.serialize = serialize
        self.kw_only = bool(kw_only)
        self.doc = doc
        self.metadata: Mapping[str, Any] = MappingProxyType(dict(metadata or {}))
        self.converter = converter
        self.validators = validators
        self.annotated: tuple[Callable[..., Any], ...] = ()
        self.derived = derived
        self.override = bool(override)
        self.initvar = False
        if default is not MISSING and type(default).__hash__ is None:
            problem = mutable_default_problem(default)
            if problem:
                problems.append(problem)
        self._problems = tuple(problems)

    @property
    def has_default(self) -> bool:
        """Whether the field can be omitted from the constructor (a default or a factory)."""
        return self.default is not MISSING or self.default_factory is not MISSING

    @property
    def is_derived(self) -> bool:
        """Whether the value is computed by ``derived`` from other fields."""
        return self.derived is not None

    @property
    def should_serialize(self) -> bool:
        """Whether exports store this field: by kind unless ``serialize`` says otherwise.

        Node and static fields are stored, opaque ones are not, derived ones never.
        """
        if self.derived is not None:
            return False
        if self.serialize is not None:
            return bool(self.serialize)
        return self.kind is not FieldKind.OPAQUE

    @property
    def validator(self) -> Callable[..., Any] | tuple[Callable[..., Any], ...] | None:
        """The validator as declared: one callable, a tuple of them, or ``None``.

        Constraints written in the annotation are not part of it (see ``annotated``).
        """
        declared = self.declared_validators
        if not declared:
            return None
        return declared[0] if len(declared) == 1 else declared

    @property
    def declared_validators(self) -> tuple[Callable[..., Any], ...]:
        """The validators given to :func:`field`, without those taken from the annotation."""
        if not self.annotated:
            return self.validators
        return self.validators[: len(self.validators) - len(self.annotated)]

    @property
    def static(self) -> bool:
        """Whether the field is static aux data."""
        return self.kind is FieldKind.STATIC

    @property
    def pytree(self) -> bool:
        """Whether JAX sees the field at all (node or static)."""
        return self.kind is not FieldKind.OPAQUE

    def make_default(self) -> Any:
        """Return the default value, calling the factory if there is one."""
        if self.default_factory is not MISSING:
            return self.default_factory()
        return self.default

    def _copy(self) -> FieldSpec:
        new = object.__new__(FieldSpec)
        for slot in FieldSpec.__slots__:
            object.__setattr__(new, slot, getattr(self, slot))
        return new

    def __repr__(self) -> str:
        parts = [f"name={self.name!r}", f"kind={self.kind.name}"]
        if self.default is not MISSING:
            parts.append(f"default={self.default!r}")
        if self.default_factory is not MISSING:
            parts.append(f"default_factory={self.default_factory!r}")
        for flag, value in (("init", self.init), ("repr", self.repr), ("compare", self.compare)):
            if not value:
                parts.append(f"{flag}=False")
        if self.kw_only:
            parts.append("kw_only=True")
        if self.serialize is not None:
            parts.append(f"serialize={self.serialize}")
        if self.converter is not None:
            parts.append(f"converter={self.converter!r}")
        if self.declared_validators:
            parts.append(f"validator={self.validator!r}")
        if self.derived is not None:
            parts.append(f"derived={self.derived!r}")
        return f"FieldSpec({', '.join(parts)})"


@overload
def field(
    *,
    default: T,
    static: bool = ...,
    pytree: bool = ...,
    init: bool = ...,
    repr: bool = ...,
    compare: bool = ...,
    serialize: bool | None = ...,
    kw_only: bool = ...,
    doc: str | None = ...,
    metadata: Mapping[str, Any] | None = ...,
    converter: Callable[..., Any] | None = ...,
    validator: Callable[..., Any] | Iterable[Callable[..., Any]] | None = ...,
    override: bool = ...,
) -> T: ...
@overload
def field(
    *,
    default_factory: Callable[[], T],
    static: bool = ...,
    pytree: bool = ...,
    init: bool = ...,
    repr: bool = ...,
    compare: bool = ...,
    serialize: bool | None = ...,
    kw_only: bool = ...,
    doc: str | None = ...,
    metadata: Mapping[str, Any] | None = ...,
    converter: Callable[..., Any] | None = ...,
    validator: Callable[..., Any] | Iterable[Callable[..., Any]] | None = ...,
    override: bool = ...,
) -> T: ...
@overload
def field(
    *,
    static: bool = ...,
    pytree: bool = ...,
    init: bool = ...,
    repr: bool = ...,
    compare: bool = ...,
    serialize: bool | None = ...,
    kw_only: bool = ...,
    doc: str | None = ...,
    metadata: Mapping[str, Any] | None = ...,
    converter: Callable[..., Any] | None = ...,
    validator: Callable[..., Any] | Iterable[Callable[..., Any]] | None = ...,
    derived: Callable[..., Any] | None = ...,
    override: bool = ...,
) -> Any: ...
def field(
    *,
    static: bool = False,
    pytree: bool = True,
    default: Any = MISSING,
    default_factory: Any = MISSING,
    init: bool = True,
    repr: bool = True,
    compare: bool = True,
    serialize: bool | None = None,
    kw_only: bool = False,
    doc: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    converter: Callable[..., Any] | None = None,
    validator: Callable[..., Any] | Iterable[Callable[..., Any]] | None = None,
    derived: Callable[..., Any] | None = None,
    override: bool = False,
) -> Any:
    """Declare a struct field with JAX-specific controls; use as a class attribute.

    Conflicting options (``default`` with ``default_factory``, a derived node
    field, ...) are reported when the class is created, naming the class and field.

    Args:
        static: make the field aux data (``FieldKind.STATIC``).
        pytree: ``False`` hides the field from JAX (``FieldKind.OPAQUE``).
        default: the default value (immutable values only).
        default_factory: zero-argument callable giving a fresh default per instance.
        init: whether the constructor takes the field.
        repr: whether ``repr()`` shows it.
        compare: whether ``==`` and ``hash()`` use it.
        serialize: force (``True``) or skip (``False``) storing it; ``None`` decides by kind.
        kw_only: make the constructor parameter keyword-only.
        doc: a docstring for the field.
        metadata: free-form mapping for tools.
        converter: ``converter(value)`` or ``converter(self, value)``, applied on every assignment.
        validator: one callable or a list; ``validator(value)`` or ``validator(self, value)``;
            returning ``False`` raises :class:`ValidationError`.
        derived: ``derived()`` or ``derived(self)``, computing the value (static or opaque only,
            with ``init=False``).
        override: set when a subclass deliberately redeclares an inherited field.

    Returns:
        A :class:`FieldSpec` (typed as the field's value for type checkers).

    Example:
        >>> import jaxstruct.core as js
        >>> class Box(js.Struct):
        ...     count: int = js.field(converter=int)
        ...     label: str = js.field(static=True, default="box", converter=str.strip)
        >>> Box(count="3", label="  crate ")
        Box(count=3, label='crate')
    """
    return FieldSpec(
        static=static,
        pytree=pytree,
        default=default,
        default_factory=default_factory,
        init=init,
        repr=repr,
        compare=compare,
        serialize=serialize,
        kw_only=kw_only,
        doc=doc,
        metadata=metadata,
        converter=converter,
        validator=validator,
        derived=derived,
        override=override,
    )


def _is_static(metadata: Mapping[str, Any]) -> bool:
    """Whether field metadata asks for a static field (equinox's or flax/optree's convention)."""
    return bool(metadata.get("static", False)) or metadata.get("pytree_node", True) is False


def from_dataclasses_field(f: dataclasses.Field[Any]) -> FieldSpec:
    """The :class:`FieldSpec` declaring what a stdlib ``dataclasses.field(...)`` declares.

    ``default``, ``default_factory``, ``init``, ``repr``, ``compare``, ``kw_only``
    and ``metadata`` carry over (``hash`` has no counterpart: a struct hashes by
    its compared fields). Metadata ``{"pytree_node": False}`` (``flax.struct.field``,
    optree) or ``{"static": True}`` (``equinox.field``) makes the field static, and
    ``{"converter": f}`` (``equinox.field(converter=f)``) is its converter.
    """
    default: Any = MISSING if f.default is dataclasses.MISSING else f.default
    factory: Any = MISSING if f.default_factory is dataclasses.MISSING else f.default_factory
    metadata = f.metadata
    return FieldSpec(
        default=default,
        default_factory=factory,
        init=f.init,
        repr=f.repr,
        compare=f.compare,
        kw_only=f.kw_only is True,
        metadata=metadata,
        static=_is_static(metadata),
        converter=metadata.get("converter"),
    )


def mutable_default_problem(value: Any) -> str | None:
    """Say why ``value`` cannot be a shared default (mutable and unhashable), or ``None``.

    The rule is the one of :mod:`dataclasses` (a default whose type is
    unhashable is taken to be mutable), except for JAX arrays, which are
    unhashable but immutable, so sharing one is safe.
    """
    kind = type(value)
    if kind.__hash__ is not None:
        return None
    import jax

    if isinstance(value, jax.Array):
        return None
    name = kind.__name__
    factory = name if kind in (list, dict, set, bytearray) else f"lambda: {name}(...)"
    return (
        f"the default {_short_repr(value)} is a mutable {name} that every instance would "
        f"share; use field(default_factory={factory}) to give each instance its own"
    )


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def required_positional(fn: Callable[..., Any]) -> int | None:
    """Count the required positional parameters of ``fn``; ``None`` when it has no signature.

    This is how hook arity is decided, once per class and never by trial calls:
    ``str.strip`` has one required parameter (its optional ``chars`` does not
    count), ``lambda self, value: ...`` has two.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    count = 0
    for param in sig.parameters.values():
        positional = param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD)
        if positional and param.default is param.empty:
            count += 1
    return count
