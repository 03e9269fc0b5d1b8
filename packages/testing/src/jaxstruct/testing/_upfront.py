"""The named sizes an instance draws before any value, so that shrinking lowers them first.

Hypothesis shrinks a failing example by simplifying the sequence of choices
that drew it, earliest first. Named sizes used to be drawn where the first
array using them was, between the elements of other arrays: lowering one
then reshuffled every choice after it, the shrinker rarely got a smaller
shape to fail again, and each shape it tried compiled jitted code anew (a
shrink of minutes that stopped at 3x3). Drawn first, each size is one early
choice: the shrinker tries the smaller shapes at once, then works on the
values of a shape that stays fixed (no further compilations).

Sizes a field binds (``sizes={"n": "n_sites"}``) or an override's arrays
show are left to them, as before.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import jaxstruct.core as js
from jaxstruct.core import FieldSpec

from ._abstract import is_abstract_class
from ._arrays import array_request
from ._checks import NOTHING, Checks, checks_from

__all__ = ["Upfront", "upfront_sizes"]

#: (size name, least size, whether it is variadic: ``*batch``).
Upfront = tuple[str, int, bool]


def _arrays_in(annotation: Any, checks: Checks) -> list[tuple[Any, Checks]]:
    """The array requests an annotation holds at its top (through Annotated, Optional)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *metadata = typing.get_args(annotation)
        return _arrays_in(base, checks.merge(checks_from(metadata)))
    request = array_request(annotation)
    if request is not None:
        return [(request.dims, checks)]
    if origin is typing.Union or origin is types.UnionType:
        found: list[tuple[Any, Checks]] = []
        for arg in typing.get_args(annotation):
            found += _arrays_in(arg, checks)
        return found
    return []


def _names(dims: Any, checks: Checks) -> list[Upfront]:
    if dims is None:
        return []
    found: list[Upfront] = []
    last = len(dims) - 1
    for index, dim in enumerate(dims):
        kind = type(dim).__name__
        name: str = getattr(dim, "name", "")
        if kind == "_NamedDim":
            least = 1 if checks.structure == "simplex" and index == last else 0
            found.append((name, least, False))
        elif kind == "_NamedVariadicDim":
            found.append((name, 0, True))
    return found


def _struct_class(annotation: Any) -> type | None:
    if (
        isinstance(annotation, type)
        and js.is_struct(annotation)
        and not is_abstract_class(annotation)
    ):
        return annotation
    return None


def upfront_sizes(
    cls: type,
    hints_of: Callable[[type], dict[str, Any]],
    settable: Mapping[str, FieldSpec],
    overrides: Mapping[str, Any],
    bindings: Mapping[str, str],
) -> tuple[Upfront, ...]:
    """The named sizes to draw first for ``cls``, in the order its fields first use them.

    ``overrides`` may hold paths (``"initial.cov"``); the sizes an overridden
    field's annotation names are left out (the override's arrays bind them),
    and so are those ``bindings`` bind to fields.
    """
    found: dict[str, Upfront] = {}
    left_out: set[str] = set(bindings)

    def walk(
        klass: type,
        fields: Mapping[str, FieldSpec],
        paths: Mapping[str, Any],
        seen: tuple[type, ...],
    ) -> None:
        hints = hints_of(klass)
        plain = {k for k in paths if "." not in k}
        for name, spec in fields.items():
            annotation = hints.get(name, spec.type)
            checks = checks_from(spec.validators) if spec.validators else NOTHING
            entries = [n for dims, c in _arrays_in(annotation, checks) for n in _names(dims, c)]
            if name in plain:
                # An overridden array binds the sizes its shape shows (a whole nested
                # struct drawn by an override has sizes of its own).
                left_out.update(entry[0] for entry in entries)
                continue
            for entry in entries:
                known = found.get(entry[0])
                if known is None or entry[1] > known[1]:
                    found[entry[0]] = entry
            nested = _struct_class(annotation)
            if nested is not None and nested not in seen:
                inner = {
                    k.partition(".")[2]: v for k, v in paths.items() if k.startswith(name + ".")
                }
                walk(nested, _settable(nested), inner, (*seen, nested))

    walk(cls, settable, overrides, (cls,))
    return tuple(entry for name, entry in found.items() if name not in left_out)


def _settable(cls: type) -> dict[str, FieldSpec]:
    return {n: f for n, f in js.fields(cls).items() if f.init and f.derived is None}
