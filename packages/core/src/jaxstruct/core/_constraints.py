"""Checks of field values that a class enforces and ``jaxstruct.testing`` can satisfy.

A constraint is a validator (``js.field(validator=positive_definite)``) that
also says what it wants in words a test-data generator can read: its
``kind`` and, for :func:`bounded`, its bounds. Written as ``Annotated``
metadata (``Annotated[Float[Array, "n n"], positive_definite]``) it is added
to the field's validators when the class is created, so the class refuses a
bad value either way, with a :class:`~jaxstruct.core.ValidationError` naming
the field and what is wrong.

Values may be Python numbers, NumPy or JAX arrays; array checks apply to
every element (``finite``, ``bounded``), to the last two axes (``symmetric``,
``positive_definite``) or to the last axis (``simplex``), so leading batch
axes are fine. Under ``jax.jit`` (a traced value), only what the shape says is
checked: values are unknown until the function runs.

Kept free of the testing layer and of Hypothesis: ``jaxstruct.testing`` reads
``kind`` and the bounds, nothing else.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Final

import numpy as np

__all__ = [
    "Bounded",
    "Constraint",
    "Finite",
    "PositiveDefinite",
    "Simplex",
    "Symmetric",
    "bounded",
    "finite",
    "is_traced",
    "nonnegative",
    "positive",
    "positive_definite",
    "simplex",
    "symmetric",
]


def is_traced(value: Any) -> bool:
    """Whether ``value`` is a JAX tracer (its values unknown until the traced function runs)."""
    kind = type(value)
    if kind in _CONCRETE:
        return False
    from jax.core import Tracer

    return isinstance(value, Tracer)


_CONCRETE = frozenset({int, float, bool, complex, np.ndarray})


def _array(value: Any) -> np.ndarray:
    """The value as a NumPy array on the host (JAX arrays are copied; bfloat16 stays)."""
    return np.asarray(value)


def _wide(array: np.ndarray) -> np.ndarray:
    """``array`` in float64 (complex128 for complex) for checks computed in full precision."""
    if array.dtype.kind == "c":
        return array.astype(np.complex128)
    return array.astype(np.float64)


def _eps(array: np.ndarray) -> float:
    """The machine epsilon of ``array``'s dtype (0 for exact dtypes: ints and bools)."""
    if array.dtype.kind in "biu":
        return 0.0
    try:
        return float(np.finfo(array.dtype).eps)
    except (TypeError, ValueError):  # NumPy has no finfo of ml_dtypes' types (bfloat16)
        import ml_dtypes

        return float(ml_dtypes.finfo(array.dtype).eps)


def _number(value: float) -> str:
    return f"{value:.6g}"


class Constraint:
    """A check of a field's value, usable as a validator and as ``Annotated`` metadata.

    Calling it returns whether ``value`` is acceptable; :meth:`explain` says
    why not. Equal constraints (same kind, same bounds) compare equal, so a
    subclass redeclaring a field with the same annotation keeps its checks.

    Write your own by subclassing and overriding :meth:`explain`; it works as
    a validator at once. ``jaxstruct.testing`` draws values satisfying the
    built-in kinds directly, and filters the draws through any other.

    Example:
        >>> import numpy as np
        >>> from jaxstruct.core.constraints import Constraint
        >>> class Unit(Constraint):
        ...     name = "unit"
        ...     def explain(self, value):
        ...         norm = float(np.linalg.norm(value))
        ...         return None if abs(norm - 1) < 1e-6 else f"has norm {norm:.3g}, not 1"
        >>> Unit()(np.array([0.6, 0.8]))
        True
        >>> Unit().explain(np.array([1.0, 1.0]))
        'has norm 1.41, not 1'
    """

    __slots__ = ()

    #: What ``jaxstruct.testing`` reads to draw values: ``"finite"``, ``"bounded"``,
    #: ``"symmetric"``, ``"positive_definite"``, ``"simplex"``, or ``"custom"``.
    kind: ClassVar[str] = "custom"
    #: How the constraint is named in messages (defaults to the class name).
    name: str = ""

    def __call__(self, value: Any) -> bool:
        """Return whether ``value`` satisfies the constraint."""
        return self.explain(value) is None

    def explain(self, value: Any) -> str | None:
        """Say what is wrong with ``value`` (``"is not symmetric ..."``), or ``None`` if nothing."""
        raise NotImplementedError(f"{type(self).__qualname__} must define explain(value)")

    def _key(self) -> tuple[Any, ...]:
        return ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Constraint)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self), self._key()))

    def __repr__(self) -> str:
        return self.name or type(self).__name__


class Finite(Constraint):
    """No NaN and no infinity, in a number or in any element of an array (ints always pass)."""

    __slots__ = ()
    kind: ClassVar[str] = "finite"
    name = "finite"

    def explain(self, value: Any) -> str | None:
        if is_traced(value):
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return None if math.isfinite(value) else f"is {value!r}"
        array = _array(value)
        if array.dtype.kind in "biu":
            return None
        if array.dtype.kind not in "fc" and array.dtype.name != "bfloat16":
            return f"holds {array.dtype} values, not numbers"
        bad = ~np.isfinite(_wide(array))
        count = int(np.count_nonzero(bad))
        if count == 0:
            return None
        if array.ndim == 0:
            return f"is {array.item()!r}"
        return f"has {count} of {array.size} elements NaN or infinite"


class Bounded(Constraint):
    """Every element (or the number) lies between ``lo`` and ``hi`` (see :func:`bounded`).

    The bounds are also readable as ``ge``/``gt``/``le``/``lt`` attributes, as
    ``annotated_types`` spells them (``None`` when absent).
    """

    __slots__ = ("exclude_hi", "exclude_lo", "hi", "lo", "name")
    kind: ClassVar[str] = "bounded"

    def __init__(
        self,
        lo: float | None = None,
        hi: float | None = None,
        *,
        exclude_lo: bool = False,
        exclude_hi: bool = False,
        name: str = "",
    ) -> None:
        for label, bound in (("lo", lo), ("hi", hi)):
            if bound is not None and (
                isinstance(bound, bool) or not isinstance(bound, int | float) or math.isnan(bound)
            ):
                raise TypeError(f"bounded(): {label} must be a number or None, got {bound!r}")
        if (
            lo is not None
            and hi is not None
            and (lo > hi or (lo == hi and (exclude_lo or exclude_hi)))
        ):
            raise ValueError(f"bounded(): no number lies between {lo!r} and {hi!r}")
        self.lo = lo
        self.hi = hi
        self.exclude_lo = bool(exclude_lo) and lo is not None
        self.exclude_hi = bool(exclude_hi) and hi is not None
        self.name = name or self._spelling()

    def _spelling(self) -> str:
        args = [repr(self.lo), repr(self.hi)]
        if self.exclude_lo:
            args.append("exclude_lo=True")
        if self.exclude_hi:
            args.append("exclude_hi=True")
        return f"bounded({', '.join(args)})"

    def _key(self) -> tuple[Any, ...]:
        return (self.lo, self.hi, self.exclude_lo, self.exclude_hi)

    @property
    def ge(self) -> float | None:
        """The inclusive lower bound, or ``None``."""
        return None if self.exclude_lo else self.lo

    @property
    def gt(self) -> float | None:
        """The exclusive lower bound, or ``None``."""
        return self.lo if self.exclude_lo else None

    @property
    def le(self) -> float | None:
        """The inclusive upper bound, or ``None``."""
        return None if self.exclude_hi else self.hi

    @property
    def lt(self) -> float | None:
        """The exclusive upper bound, or ``None``."""
        return self.hi if self.exclude_hi else None

    def interval(self) -> str:
        """The bounds written as an interval: ``[0, 1)``, ``(0, inf)``."""
        lo = "-inf" if self.lo is None else _number(self.lo)
        hi = "inf" if self.hi is None else _number(self.hi)
        left = "(" if self.exclude_lo or self.lo is None else "["
        right = ")" if self.exclude_hi or self.hi is None else "]"
        return f"{left}{lo}, {hi}{right}"

    def explain(self, value: Any) -> str | None:
        if is_traced(value):
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            array = np.asarray(value, dtype=np.float64)
        else:
            array = _array(value)
            if array.dtype.kind not in "biuf" and array.dtype.name != "bfloat16":
                return f"holds {array.dtype} values, which have no order"
            array = _wide(array)
        inside = np.ones(array.shape, dtype=bool)
        if self.lo is not None:
            inside &= array > self.lo if self.exclude_lo else array >= self.lo
        if self.hi is not None:
            inside &= array < self.hi if self.exclude_hi else array <= self.hi
        outside = int(array.size - np.count_nonzero(inside))
        if outside == 0:
            return None
        if array.ndim == 0:
            return f"is {_number(float(array))}, outside {self.interval()}"
        bad = array[~inside]
        return (
            f"has {outside} of {array.size} elements outside {self.interval()} "
            f"(from {_number(float(np.min(bad)))} to {_number(float(np.max(bad)))})"
        )


def _square(value: Any) -> str | None:
    """Why ``value``'s shape has no square matrices in its last two axes, or ``None``."""
    shape = getattr(value, "shape", None)
    if shape is None:
        shape = np.shape(value)
    if len(shape) < 2:
        return f"expected a matrix (at least two axes), got shape {tuple(shape)}"
    if shape[-1] != shape[-2]:
        return f"expected square matrices in the last two axes, got shape {tuple(shape)}"
    return None


def _asymmetry(array: np.ndarray) -> float | None:
    """The largest ``|a - aᵀ|`` of ``array``'s matrices beyond rounding, or ``None`` if none.

    Entries equal to their mirror (NaN to NaN, inf to inf included) are
    symmetric; others may differ by a few ulps of the matrix's largest entry
    (a matrix computed as ``A @ B @ A.T`` is symmetric to rounding).
    """
    wide = _wide(array)
    mirror = np.swapaxes(wide, -1, -2)
    with np.errstate(invalid="ignore"):
        equal = (wide == mirror) | (np.isnan(wide) & np.isnan(mirror))
        if bool(np.all(equal)):
            return None
        finite = np.isfinite(wide) & np.isfinite(mirror)
        if not bool(np.all(equal | finite)):
            return math.inf
        gap = float(np.max(np.abs(np.where(equal, 0.0, wide - mirror)), initial=0.0))
        scale = float(np.max(np.abs(np.where(finite, wide, 0.0)), initial=0.0))
    # Rounding: a product is symmetric to a few ulps of its entries.
    return gap if gap > 16 * _eps(array) * scale else None


class Symmetric(Constraint):
    """Square, symmetric matrices in the last two axes (to a few ulps for floats)."""

    __slots__ = ()
    kind: ClassVar[str] = "symmetric"
    name = "symmetric"

    def explain(self, value: Any) -> str | None:
        wrong = _square(value)
        if wrong is not None or is_traced(value):
            return wrong
        gap = _asymmetry(_array(value))
        if gap is not None:
            return f"is not symmetric (largest |a - a.T| is {_number(gap)})"
        return None


class PositiveDefinite(Constraint):
    """Symmetric positive-definite matrices in the last two axes (a covariance, a precision).

    Checked by a Cholesky factorisation in float64, which NaN and infinity fail.
    """

    __slots__ = ()
    kind: ClassVar[str] = "positive_definite"
    name = "positive_definite"

    def explain(self, value: Any) -> str | None:
        wrong = _square(value)
        if wrong is not None or is_traced(value):
            return wrong
        array = _array(value)
        if array.dtype.kind not in "biuf" and array.dtype.name != "bfloat16":
            return f"holds {array.dtype} values; expected real matrices"
        wide = _wide(array)
        if not np.all(np.isfinite(wide)):
            return "has NaN or infinite entries"
        gap = _asymmetry(array)
        if gap is not None:
            return f"is not symmetric (largest |a - a.T| is {_number(gap)})"
        if wide.size == 0:
            return None
        try:
            np.linalg.cholesky((wide + np.swapaxes(wide, -1, -2)) / 2)
        except np.linalg.LinAlgError:
            smallest = float(np.min(np.linalg.eigvalsh(wide)))
            return f"is not positive definite (smallest eigenvalue {_number(smallest)})"
        return None


class Simplex(Constraint):
    """Non-negative entries summing to 1 along the last axis (probability vectors).

    The sum may be off by a few ulps per entry (what normalising in the
    array's dtype leaves).
    """

    __slots__ = ()
    kind: ClassVar[str] = "simplex"
    name = "simplex"

    def explain(self, value: Any) -> str | None:
        shape = getattr(value, "shape", None)
        if shape is None:
            shape = np.shape(value)
        if len(shape) < 1 or shape[-1] == 0:
            return (
                f"expected vectors of at least one entry in the last axis, got shape {tuple(shape)}"
            )
        if is_traced(value):
            return None
        array = _array(value)
        if array.dtype.kind not in "biuf" and array.dtype.name != "bfloat16":
            return f"holds {array.dtype} values; expected real numbers"
        wide = _wide(array)
        if not np.all(np.isfinite(wide)):
            return "has NaN or infinite entries"
        if np.any(wide < 0):
            return f"has negative entries (smallest {_number(float(np.min(wide)))})"
        sums = np.sum(wide, axis=-1)
        tolerance = 4 * shape[-1] * _eps(array)
        off = float(np.max(np.abs(sums - 1), initial=0.0))
        if not off <= tolerance:
            worst = float(np.ravel(sums)[int(np.argmax(np.abs(np.ravel(sums) - 1)))])
            return f"has entries summing to {_number(worst)}, not 1"
        return None


#: No NaN and no infinity (every element of an array).
finite: Final = Finite()
#: Square symmetric matrices in the last two axes.
symmetric: Final = Symmetric()
#: Symmetric positive-definite matrices in the last two axes (covariances).
positive_definite: Final = PositiveDefinite()
#: Non-negative vectors summing to 1 along the last axis (probabilities).
simplex: Final = Simplex()


def bounded(
    lo: float | None = None,
    hi: float | None = None,
    *,
    exclude_lo: bool = False,
    exclude_hi: bool = False,
) -> Bounded:
    """Return the constraint ``lo <= x <= hi`` on a number or on every element of an array.

    Either bound may be ``None`` (unbounded on that side); ``exclude_lo`` and
    ``exclude_hi`` make a bound strict. NaN is outside every bound.

    Args:
        lo: the lower bound, or ``None``.
        hi: the upper bound, or ``None``.
        exclude_lo: refuse ``x == lo``.
        exclude_hi: refuse ``x == hi``.

    Returns:
        A :class:`Bounded` constraint.

    Raises:
        TypeError: a bound is not a number.
        ValueError: no number lies between the bounds.

    Example:
        >>> import numpy as np
        >>> import jaxstruct.core as js
        >>> from jaxstruct.core.constraints import bounded
        >>> class Gate(js.Struct):
        ...     w: np.ndarray = js.field(validator=bounded(-1, 1))
        >>> Gate(w=np.array([0.5, -1.0])).w.tolist()
        [0.5, -1.0]
        >>> Gate(w=np.array([0.5, 3.0]))  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        jaxstruct.core._errors.ValidationError: Gate.w: bounded(-1, 1) refused float64[2]: has 1 of
        2 elements outside [-1, 1] (from 3 to 3); pass a value it accepts
    """
    return Bounded(lo, hi, exclude_lo=exclude_lo, exclude_hi=exclude_hi)


#: Greater than 0 (every element).
positive: Final = Bounded(0, None, exclude_lo=True, name="positive")
#: Greater than or equal to 0 (every element).
nonnegative: Final = Bounded(0, None, name="nonnegative")
