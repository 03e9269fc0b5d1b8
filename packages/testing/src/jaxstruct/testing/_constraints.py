"""Valid field values by construction: what a converter accepts, what validators allow.

``structs()`` used to build an instance from annotation-only draws and throw
the whole draw away when a validator or converter refused it: with two or
three checked fields most draws were lost, and Hypothesis' ``filter_too_much``
health check fired. Here each field's strategy is narrowed on its own:

* constraints (``jaxstruct.core.constraints``) and bounds written in the
  annotation (``Annotated[float, Ge(0)]``, any metadata object with
  ``gt``/``ge``/``lt``/``le`` attributes, as ``annotated_types`` has) or given
  as validators are built into the drawn numbers and arrays (see ``_checks``
  and ``_satisfy``);
* a one-argument validator of a field without converter is handed to
  Hypothesis' ``filter``, which turns comparisons it can read
  (``lambda w: w >= 0``, ``def positive(x): return x > 0``) into bounded
  draws; other validators filter the field's draws, not the instance's (each
  refused value counted for the health-check note, naming class, field and check);
* a converter whose first parameter is annotated gets values of that type;
  one that is not gets real-valued leaves (a complex array cast to a real
  dtype loses its imaginary part and warns), never nested containers.
"""

from __future__ import annotations

import inspect
import math
import typing
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st
from jaxstruct.core import FieldSpec
from jaxstruct.core.constraints import Constraint

from ._checks import is_built
from ._refusals import record_field_refusal

__all__ = ["annotated_bounds", "converter_input", "narrowed"]

_BOUNDS = ("gt", "ge", "lt", "le")


def _takes_instance(fn: Callable[..., Any]) -> bool:
    """Whether a hook is called as ``fn(instance, value)`` (two required positionals)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    required = [
        p
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(required) >= 2


def annotated_bounds(base: Any, metadata: tuple[Any, ...]) -> st.SearchStrategy[Any] | None:
    """A bounded ``int``/``float`` strategy from ``Annotated`` metadata, or ``None``.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Ge:
        ...     ge: float
        >>> @dataclass
        ... class Lt:
        ...     lt: float
        >>> annotated_bounds(int, (Ge(3), Lt(10)))
        integers(min_value=3, max_value=9)
        >>> annotated_bounds(float, (Ge(0), Lt(1)))
        floats(min_value=0, max_value=1, allow_nan=False, exclude_max=True)
        >>> annotated_bounds(str, (Ge(3),)) is None
        True
    """
    if base not in (int, float):
        return None
    found = {
        name: getattr(meta, name)
        for meta in metadata
        for name in _BOUNDS
        if getattr(meta, name, None) is not None
    }
    if not found:
        return None
    if base is int:
        low = found.get("ge", -(2**31))
        if "gt" in found:
            low = max(low, math.floor(found["gt"]) + 1)
        high = found.get("le", 2**31 - 1)
        if "lt" in found:
            high = min(high, math.ceil(found["lt"]) - 1)
        return st.integers(math.ceil(low), math.floor(high))
    low_f = found.get("gt", found.get("ge"))
    high_f = found.get("lt", found.get("le"))
    return st.floats(
        min_value=low_f,
        max_value=high_f,
        exclude_min="gt" in found,
        exclude_max="lt" in found,
        allow_nan=False,
    )


def converter_input(spec: FieldSpec) -> Any:
    """The annotation of the converter's value parameter, or ``None`` when it has none."""
    converter = spec.converter
    if converter is None or isinstance(converter, type):
        return None
    try:
        params = list(inspect.signature(converter).parameters.values())
        hints = typing.get_type_hints(converter, include_extras=True)
    except Exception:  # builtins without signatures, unresolvable names
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional:
        return None
    value = positional[1] if _takes_instance(converter) and len(positional) > 1 else positional[0]
    hint = hints.get(value.name)
    return None if hint is None or hint is Any else hint


def _fully_rewritten(strategy: st.SearchStrategy[Any]) -> bool:
    """Whether Hypothesis turned ``strategy``'s filter into bounds (nothing is rejected).

    Only an optimisation: when the check cannot tell, the filter stays a filter.
    """
    try:
        inner = getattr(strategy, "wrapped_strategy", strategy)
    except Exception:  # pragma: no cover - defensive: a strategy that fails to build
        return False
    return type(inner).__name__ != "FilteredStrategy"


def _truthy(result: Any) -> bool:
    if result is None:  # a validator that returns nothing accepts (it raises to refuse)
        return True
    if result is True or result is False:
        return result
    try:
        return bool(np.all(np.asarray(result)))
    except (TypeError, ValueError):
        return bool(result)


_SCALAR_TYPES = (int, float, complex, str, bytes, bool)


def _described(value: Any) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None:
        return f"{dtype}[{','.join(map(str, shape))}]"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _why(check: Any, value: Any) -> str:
    """Why ``check`` refused ``value``, as core would say it."""
    if isinstance(check, Constraint):
        explained = check.explain(value)
        return f"{check!r} refused {_described(value)}" + (f": {explained}" if explained else "")
    name = getattr(check, "__qualname__", None) or repr(check)
    return f"validator {name!r} rejected {_described(value)}"


def narrowed(
    spec: FieldSpec,
    strategy: st.SearchStrategy[Any],
    annotation: Any = None,
    *,
    hashable: bool = False,
    cls: type | None = None,
    honoured: frozenset[str] = frozenset(),
    leftover: tuple[Any, ...] = (),
) -> st.SearchStrategy[Any]:
    """Narrow a field's strategy to values its converter and one-argument validators accept.

    ``annotation`` is what ``strategy`` draws: a converter that is that same
    scalar type (``n: int = field(converter=int)``) changes nothing on such
    values, so the validators are read as if there were no converter. With
    ``hashable`` (a static field), the converted value must also be hashable.
    Constraints whose kind is in ``honoured`` are satisfied by the draw
    already and not checked again (unless a converter changes the value);
    ``leftover`` constraints (those the draw could not build in) filter too.
    Validators that also take the instance, and ``__post_init__`` or checks,
    still decide at construction (a refused draw is then discarded). Each
    value the filter refuses is counted for the health-check note, naming
    ``cls``, the field and the check.
    """
    converter = spec.converter
    if converter in _SCALAR_TYPES and annotation is converter:
        converter = None
    if converter is not None and _takes_instance(converter):
        return strategy
    remaining = [
        v
        for v in spec.validators
        if not _takes_instance(v)
        and not (isinstance(v, Constraint) and v.kind == "annotation")  # read from the hints
        and not (converter is None and is_built(v) and v.kind in honoured and v not in leftover)
    ]
    remaining += [c for c in leftover if c not in remaining]
    if converter is None:
        for validator in list(remaining):
            if isinstance(validator, Constraint):
                continue
            bounded = strategy.filter(validator)
            if _fully_rewritten(bounded):
                strategy = bounded
                remaining.remove(validator)
    if not remaining and converter is None and not hashable:
        return strategy
    where = (cls.__qualname__ if cls is not None else "?", spec.name)

    def accepted(value: Any) -> bool:
        # Warnings count as refusals, as under pytest's "warnings are errors".
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                out = converter(value) if converter is not None else value
            except Exception as err:
                name = getattr(converter, "__qualname__", None) or repr(converter)
                record_field_refusal(f"converter {name!r} raised {type(err).__name__}", where)
                return False
            if hashable:
                try:
                    hash(out)
                except Exception:
                    record_field_refusal(f"unhashable {type(out).__name__}", where)
                    return False
            for check in remaining:
                try:
                    ok = _truthy(check(out))
                except Exception as err:
                    name = getattr(check, "__qualname__", None) or repr(check)
                    record_field_refusal(
                        f"validator {name!r} raised {type(err).__name__}: {err}", where
                    )
                    return False
                if not ok:
                    record_field_refusal(_why(check, out), where)
                    return False
            return True

    return strategy.filter(accepted)
