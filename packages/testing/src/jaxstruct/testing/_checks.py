"""What a field's constraints ask of its values, read once per field.

Two sources say it: ``Annotated`` metadata (core's constraints,
``annotated_types``' ``Ge``/``Gt``/``Le``/``Lt``/``Interval``, any object with
``gt``/``ge``/``lt``/``le`` attributes) and the field's validators that are
core constraints (``js.field(validator=positive_definite)``). The draw then
builds values that satisfy them (see ``_satisfy``) instead of filtering.
One structure (symmetric, positive definite, simplex) is built per value;
what cannot be built alongside it (bounds on a covariance) stays a check
that filters the field's draws.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any, TypeGuard

from jaxstruct.core.constraints import Bounded, Constraint

__all__ = ["BUILT", "Checks", "checks_from"]

#: The constraint kinds the draws build in.
BUILT = frozenset({"finite", "bounded", "symmetric", "positive_definite", "simplex"})
_STRUCTURES = ("symmetric", "positive_definite", "simplex")
_BOUNDS = ("gt", "ge", "lt", "le")


@dataclasses.dataclass(frozen=True)
class Checks:
    """The constraints a field's values must satisfy, in the form the draws use.

    Attributes:
        lo, hi: the bounds of every element (``None``: unbounded).
        exclude_lo, exclude_hi: whether a bound is strict.
        finite: no NaN and no infinity.
        structure: ``"symmetric"``, ``"positive_definite"``, ``"simplex"`` or ``None``.
        validated: the field has validators: float draws are finite most of the time.
        elements: a strategy of elements given by the user (``arrays(elements=...)``).
        leftover: constraints the draw cannot build in; they filter the field's draws.
    """

    lo: float | None = None
    hi: float | None = None
    exclude_lo: bool = False
    exclude_hi: bool = False
    finite: bool = False
    structure: str | None = None
    validated: bool = False
    elements: Any = None
    leftover: tuple[Constraint, ...] = ()

    @property
    def bounded(self) -> bool:
        """Whether the elements have a bound."""
        return self.lo is not None or self.hi is not None

    @property
    def empty(self) -> bool:
        """Whether nothing is asked (the draws are the unconstrained ones)."""
        return self == NOTHING

    def bounds(self) -> Bounded:
        """The bounds as a core constraint (to check a value against them)."""
        return Bounded(self.lo, self.hi, exclude_lo=self.exclude_lo, exclude_hi=self.exclude_hi)

    def merge(self, other: Checks) -> Checks:
        """Both sets of checks at once: bounds intersect, one structure is built."""
        merged = self
        if other.bounded:
            merged = merged._bound(other.lo, other.hi, other.exclude_lo, other.exclude_hi)
        if other.structure is not None:
            merged = merged._structured(other.structure)
        return dataclasses.replace(
            merged,
            finite=merged.finite or other.finite,
            validated=merged.validated or other.validated,
            elements=other.elements if other.elements is not None else merged.elements,
            leftover=(*merged.leftover, *(c for c in other.leftover if c not in merged.leftover)),
        )._settled()

    def _bound(
        self, lo: float | None, hi: float | None, exclude_lo: bool, exclude_hi: bool
    ) -> Checks:
        new_lo, new_xlo = self.lo, self.exclude_lo
        if lo is not None and (new_lo is None or lo > new_lo or (lo == new_lo and exclude_lo)):
            new_lo, new_xlo = lo, exclude_lo
        new_hi, new_xhi = self.hi, self.exclude_hi
        if hi is not None and (new_hi is None or hi < new_hi or (hi == new_hi and exclude_hi)):
            new_hi, new_xhi = hi, exclude_hi
        return dataclasses.replace(
            self, lo=new_lo, hi=new_hi, exclude_lo=new_xlo, exclude_hi=new_xhi
        )

    def _structured(self, structure: str) -> Checks:
        current = self.structure
        if current is None or current == structure:
            return dataclasses.replace(self, structure=structure)
        pair = {current, structure}
        if pair == {"symmetric", "positive_definite"}:  # positive definite is symmetric too
            return dataclasses.replace(self, structure="positive_definite")
        extra = _STRUCTURE_CONSTRAINTS[structure]
        return dataclasses.replace(self, leftover=(*self.leftover, extra))

    def _settled(self) -> Checks:
        """Bounds on a built covariance or simplex are checked, not built (rare, and hard)."""
        if self.structure in ("positive_definite", "simplex") and self.bounded:
            bounds = self.bounds()
            return dataclasses.replace(
                self,
                lo=None,
                hi=None,
                exclude_lo=False,
                exclude_hi=False,
                leftover=(*self.leftover, bounds),
            )
        return self


NOTHING = Checks()


def _structure_constraints() -> dict[str, Constraint]:
    from jaxstruct.core.constraints import positive_definite, simplex, symmetric

    return {"symmetric": symmetric, "positive_definite": positive_definite, "simplex": simplex}


_STRUCTURE_CONSTRAINTS = _structure_constraints()


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _one(item: Any) -> Checks | None:
    """The checks one metadata item or validator asks for, or ``None`` if it asks none we build."""
    if isinstance(item, Constraint):
        kind = item.kind
        if kind == "finite":
            return Checks(finite=True)
        if kind == "bounded":
            lo = _number(getattr(item, "lo", None))
            hi = _number(getattr(item, "hi", None))
            return Checks(
                lo=lo,
                hi=hi,
                exclude_lo=bool(getattr(item, "exclude_lo", False)) and lo is not None,
                exclude_hi=bool(getattr(item, "exclude_hi", False)) and hi is not None,
            )
        if kind in _STRUCTURES:
            return Checks(structure=kind)
        return None
    found = {name: _number(getattr(item, name, None)) for name in _BOUNDS}
    if all(v is None for v in found.values()):
        return None
    checks = NOTHING
    for name, value in found.items():
        if value is None:
            continue
        if name in ("gt", "ge"):
            checks = checks._bound(value, None, name == "gt", False)
        else:
            checks = checks._bound(None, value, False, name == "lt")
    return checks


def checks_from(items: Iterable[Any], *, validated: bool = False) -> Checks:
    """Read the checks of ``Annotated`` metadata items or of a field's validators.

    Example:
        >>> from jaxstruct.core.constraints import bounded, finite, symmetric
        >>> checks = checks_from([finite, bounded(-1, 1), symmetric, "a note"])
        >>> (checks.lo, checks.hi, checks.finite, checks.structure)
        (-1.0, 1.0, True, 'symmetric')
    """
    checks = Checks(validated=validated)
    for item in items:
        found = _one(item)
        if found is not None:
            checks = checks.merge(found)
    return checks


def is_built(item: Any) -> TypeGuard[Constraint]:
    """Whether ``item`` is a constraint the draws build in (when the checks are honoured)."""
    return isinstance(item, Constraint) and item.kind in BUILT
