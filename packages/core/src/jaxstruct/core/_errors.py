"""Error types of ``jaxstruct.core`` (the shared ones come from the registry layer)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

from jaxstruct.registry import StructError

__all__ = [
    "FrozenStructError",
    "MissingDistributionError",
    "Refusal",
    "RefusalCheck",
    "StructDefinitionError",
    "TracedCheckError",
    "TracedComparisonError",
    "UnassignedFieldError",
    "ValidationError",
    "attach_refusal",
    "refusal_of",
    "traced_check_message",
]

#: Which step of construction refused a value (see :class:`Refusal`).
RefusalCheck = Literal[
    "missing", "unknown", "converter", "validator", "static", "type", "post_init", "check_init"
]

#: The attribute core sets on an exception it raises, or lets through, while building a struct.
_ATTRIBUTE = "__jaxstruct_refusal__"


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """Who refused to build a struct, and why: read with :func:`refusal_of`.

    Attributes:
        cls: the struct class being built.
        field: the field whose value was refused, or ``None`` for the whole
            instance (``__post_init__``, ``__check_init__``).
        check: the step that refused: ``"missing"`` (a required field got no
            value), ``"unknown"`` (a value for no field), ``"converter"``,
            ``"validator"``, ``"static"`` (a static value that is an array or
            unhashable), ``"type"`` (``typecheck=True``), ``"post_init"`` or
            ``"check_init"``.
        reason: what was wrong, in a few words, without the fix
            (``"validator 'positive' rejected 0"``).
        hook: the converter, validator or ``__check_init__`` that refused (or
            raised), else ``None``.
    """

    cls: type
    field: str | None
    check: RefusalCheck
    reason: str
    hook: Callable[..., Any] | None = None


def attach_refusal(err: BaseException, refusal: Refusal) -> BaseException:
    """Record ``refusal`` on ``err`` unless an inner step already recorded one; return ``err``."""
    if getattr(err, _ATTRIBUTE, None) is None:
        setattr(err, _ATTRIBUTE, refusal)
    return err


def refusal_of(err: BaseException) -> Refusal | None:
    """Return which check refused to build a struct when ``err`` was raised, or ``None``.

    Core records a :class:`Refusal` on each :class:`ValidationError` it raises
    and on every exception that a converter, validator, ``__post_init__`` or
    ``__check_init__`` raises while a struct is built (the user's own exception
    type is kept). ``None`` means ``err`` did not come out of building a struct.

    Example:
        >>> import jaxstruct.core as js
        >>> class P(js.Struct):
        ...     n: int = js.field(validator=lambda n: n > 0)
        >>> try:
        ...     P(n=0)
        ... except js.ValidationError as err:
        ...     why = js.refusal_of(err)
        >>> why.cls is P, why.field, why.check
        (True, 'n', 'validator')
    """
    found = getattr(err, _ATTRIBUTE, None)
    return found if isinstance(found, Refusal) else None


class ValidationError(StructError, ValueError):
    """A field value was rejected by a validator, a static-field check or a type check.

    :func:`refusal_of` says which class, field and check refused (also
    :attr:`refusal`).
    """

    @property
    def refusal(self) -> Refusal | None:
        """Which check refused (see :func:`refusal_of`); ``None`` when not raised by core."""
        return refusal_of(self)


class UnassignedFieldError(ValidationError, TypeError):
    """A required field was never assigned (by a custom ``__init__`` or ``__post_init__``).

    A ``TypeError``, as a missing constructor argument is, and a
    :class:`ValidationError`, so code catching either sees it.
    """


class FrozenStructError(StructError, dataclasses.FrozenInstanceError, AttributeError):
    """An attribute of a constructed (frozen) struct was set or deleted.

    Also a :class:`dataclasses.FrozenInstanceError` (what ``except`` clauses of
    code written for frozen dataclasses, flax.struct or chex catch), and so an
    ``AttributeError``.
    """


class StructDefinitionError(StructError, TypeError):
    """A struct class is declared in a way that would silently misbehave."""


class MissingDistributionError(StructError, ImportError):
    """A feature needs a jaxstruct distribution that is not installed."""


class TracedComparisonError(StructError, TypeError):
    """``==`` was asked about structs whose arrays are traced (values unknown until run)."""


class TracedCheckError(StructError, TypeError):
    """A validator, ``__post_init__`` or ``__check_init__`` read the value of a traced array.

    Raised when a struct is built (or ``replace``-d) inside ``jax.jit``,
    ``vmap``, ``grad`` or ``scan`` and a check needs values that are known
    only when the function runs. It is not a refusal of the value:
    :func:`refusal_of` returns ``None`` for it. The message says how to write
    the check so that it works under tracing.
    """


#: How to write a check that works on traced values (the end of TracedCheckError's message).
TRACED_CHECK_HELP = """\
Inside jax.jit, vmap, grad or scan, field values are tracers: their shapes and
dtypes are known, their values only when the function runs, so a check that
reads values (np.asarray, float(), bool(), `if` on a jnp comparison) cannot
decide. Nothing was refused. Either check only shapes and dtypes when the
value is traced:

    def unit_weights(w):
        if isinstance(w, jax.core.Tracer):
            return w.ndim == 2  # what tracing knows
        return bool(np.all(np.abs(w) <= 1))

or use a constraint of jaxstruct.core.constraints (bounded(-1, 1), finite,
positive_definite, ...), which checks shapes under tracing and values outside
it, or build the struct outside the traced function. (replace() checks only
the fields it changes.)"""


def traced_check_message(cls: type, field: str | None, hook: Any, err: BaseException) -> str:
    """The message of a :class:`TracedCheckError`: which check met a traced value, and the fix."""
    name = getattr(hook, "__qualname__", None) or repr(hook)
    if field is not None:
        what = f"{cls.__qualname__}.{field}: validator {name!r}"
    else:
        what = f"{cls.__qualname__}: {name}"
    return f"{what} cannot run on a traced value ({type(err).__name__}).\n{TRACED_CHECK_HELP}"
