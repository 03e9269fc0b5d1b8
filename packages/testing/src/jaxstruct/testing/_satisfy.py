"""Array values that satisfy a field's checks, built directly rather than filtered.

* bounds (``bounded(-1, 1)``, ``Annotated[..., Ge(-1), Le(1)]``) bound every
  element, rounded inward to the dtype's grid so a float16 or bfloat16 draw
  never lands outside;
* ``finite`` draws no NaN or infinity; a field with any validator draws
  finite floats nine arrays in ten (a plain ``finite``-style validator then
  rarely refuses), NaN and infinity in the tenth, so they stay reachable;
* ``symmetric`` mirrors the upper triangle onto the lower one (exact, bounds
  kept); ``positive_definite`` is ``A Aᵀ + d I`` with ``A``'s entries in
  [-1, 1] and ``d`` in [1/8, 1], more ``d`` only if the dtype's rounding
  asks; ``simplex`` normalises non-negative weights along the last axis
  (one-hot rows for integer dtypes).

A built covariance or probability vector is checked with core's own
constraint (the code the class runs) before it is used: when a dtype's
rounding breaks it, the diagonal grows until it holds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ._checks import Checks

__all__ = ["feasible_dtypes", "values_for"]

_FLOAT_WIDTHS = {"float16": 16, "float32": 32, "float64": 64, "bfloat16": 32}
_COMPLEX_WIDTHS = {"complex64": 64, "complex128": 128}
#: Of ten arrays drawn for a validated float field, this many are finite.
FINITE_SHARE = 9


def _numpy_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _is_float(name: str) -> bool:
    return name in _FLOAT_WIDTHS


def _is_exact(name: str) -> bool:
    return name == "bool" or name.startswith(("int", "uint"))


def _grid_bound(name: str, bound: float | None, *, upward: bool, strict: bool) -> float | None:
    """The dtype's nearest value on the inner side of ``bound`` (strictly inside if ``strict``)."""
    if bound is None:
        return None
    dtype = _numpy_dtype(name)
    with np.errstate(over="ignore"):
        value = np.asarray(bound).astype(dtype)
    towards = np.asarray(math.inf if upward else -math.inf).astype(dtype)
    outside = float(value) < bound if upward else float(value) > bound
    if outside or (strict and float(value) == bound):
        value = np.nextafter(value, towards)
    return float(value)


def _int_range(name: str, checks: Checks) -> tuple[int, int] | None:
    if name == "bool":
        low, high = 0, 1
    else:
        info = np.iinfo(np.dtype(name))
        low, high = int(info.min), int(info.max)
    if checks.lo is not None:
        lo = checks.lo
        if math.isinf(lo):
            low = low if lo < 0 else high + 1
        else:
            low = max(low, math.floor(lo) + 1 if checks.exclude_lo else math.ceil(lo))
    if checks.hi is not None:
        hi = checks.hi
        if math.isinf(hi):
            high = high if hi > 0 else low - 1
        else:
            high = min(high, math.ceil(hi) - 1 if checks.exclude_hi else math.floor(hi))
    return (low, high) if low <= high else None


def _float_range(name: str, checks: Checks) -> tuple[float | None, float | None] | None:
    lo = _grid_bound(name, checks.lo, upward=True, strict=checks.exclude_lo)
    hi = _grid_bound(name, checks.hi, upward=False, strict=checks.exclude_hi)
    if lo is not None and hi is not None and lo > hi:
        return None
    # A bound past the dtype's largest value (bounded(70000) in float16) leaves only
    # infinity, which no finite draw reaches: the dtype cannot hold the field's values.
    if (lo is not None and lo == math.inf) or (hi is not None and hi == -math.inf):
        return None
    return lo, hi


def _allowed(name: str, checks: Checks) -> bool:
    """Whether some value of dtype ``name`` satisfies ``checks``."""
    structure = checks.structure
    if name.startswith("complex"):
        return not checks.bounded and structure in (None, "symmetric")
    if structure == "positive_definite" and not _is_float(name):
        return False
    if _is_exact(name):
        return _int_range(name, checks) is not None
    return _float_range(name, checks) is not None


@functools.lru_cache(maxsize=1024)
def feasible_dtypes(names: tuple[str, ...], checks: Checks) -> tuple[str, ...]:
    """The dtypes among ``names`` for which values satisfying ``checks`` can be built.

    Example:
        >>> from jaxstruct.testing._checks import Checks
        >>> feasible_dtypes(("bool", "uint8", "float16"), Checks(lo=-3.0, hi=-1.0))
        ('float16',)
    """
    return tuple(name for name in names if _allowed(name, checks))


def floats_of_width(width: int, *, allow_nan: bool = True) -> st.SearchStrategy[float]:
    """Floats exactly representable in ``width`` bits, infinities included, drawn without rejection.

    ``st.floats(width=32)`` draws a 64-bit float and rejects it when it
    overflows the width, which was most of the rejected draws of
    ``structs()``; finite bounds at the width's largest value avoid that.

    Example:
        >>> import numpy as np
        >>> from hypothesis import find
        >>> x = find(floats_of_width(16), lambda x: 60000 < x < float("inf"))
        >>> float(np.float16(x)) == x
        True
    """
    big = float(np.finfo(f"float{width}").max)
    special = [math.inf, -math.inf, *([math.nan] if allow_nan else [])]
    return st.floats(
        min_value=-big,
        max_value=big,
        width=width,  # type: ignore[arg-type]
    ) | st.sampled_from(special)


@functools.lru_cache(maxsize=256)
def _elements_cached(name: str, checks: Checks, finite_only: bool) -> st.SearchStrategy[Any] | None:
    if _is_exact(name):
        found = _int_range(name, checks)
        assert found is not None  # feasible_dtypes ruled the others out
        low, high = found
        if name == "bool":
            return st.sampled_from([bool(v) for v in range(low, high + 1)])
        return st.integers(low, high)
    if name in _COMPLEX_WIDTHS:
        if finite_only:
            return st.complex_numbers(
                allow_nan=False,
                allow_infinity=False,
                width=_COMPLEX_WIDTHS[name],  # type: ignore[arg-type]
            )
        return None
    width = _FLOAT_WIDTHS[name]
    bounds = _float_range(name, checks)
    assert bounds is not None
    lo, hi = bounds
    if lo is None and hi is None and not finite_only:
        if name == "bfloat16":
            return None  # any bit pattern: _plain draws uint16 bits
        return floats_of_width(width)
    # An open side is closed at the dtype's largest value: st.floats(width=16)
    # would draw 64-bit floats and reject those that overflow (most of them).
    # bfloat16 is drawn as float32 between bounds on its grid, then rounded to
    # nearest: a value between two grid points stays between them.
    big = _largest(name)
    finite = st.floats(
        min_value=-big if lo is None else lo,
        max_value=big if hi is None else hi,
        allow_nan=False,
        allow_infinity=False,
        width=width,  # type: ignore[arg-type]
    )
    if finite_only or (lo is not None and hi is not None):
        return finite
    # The open side's infinity (NaN is outside any bound).
    return finite | st.just(-math.inf if lo is None else math.inf)


def _largest(name: str) -> float:
    if name == "bfloat16":
        import ml_dtypes

        return float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    return float(np.finfo(np.dtype(name)).max)


def _elements(name: str, checks: Checks, finite_only: bool) -> st.SearchStrategy[Any] | None:
    if checks.elements is not None:
        return checks.elements
    if _is_exact(name) or (checks.lo is not None and checks.hi is not None):
        finite_only = False  # nothing to leave out: the draws are finite already
    key = Checks(
        lo=checks.lo, hi=checks.hi, exclude_lo=checks.exclude_lo, exclude_hi=checks.exclude_hi
    )
    return _elements_cached(name, key, finite_only)


@functools.lru_cache(maxsize=1024)
def array_strategy(name: str, shape: tuple[int, ...], elements: Any) -> st.SearchStrategy[Any]:
    """``hnp.arrays`` of one dtype, shape and elements, built (and validated) once.

    (A tuple of elements per array draws no faster, and shrinks far slower:
    ``hnp.arrays`` lowers many elements in one step.)
    """
    return hnp.arrays(np.dtype(name), shape, elements=elements)


def _plain(
    draw: Callable[..., Any], name: str, shape: tuple[int, ...], elements: Any
) -> np.ndarray:
    """An array of dtype ``name`` with the given elements (any bit pattern when ``None``)."""
    if name == "bfloat16":
        dtype = _numpy_dtype(name)
        if elements is None:
            return draw(array_strategy("uint16", shape, None)).view(dtype)
        return draw(array_strategy("float32", shape, elements)).astype(dtype)
    return draw(array_strategy(name, shape, elements))


_UNIT = st.floats(-1, 1, allow_subnormal=False)
_SHIFT = st.floats(0.125, 1.0)
_WEIGHT = st.floats(0, 1)
_TENTHS = st.integers(0, 9)


def _mirror(array: np.ndarray) -> np.ndarray:
    """The upper triangle copied onto the lower one: exactly symmetric, the same elements."""
    n = array.shape[-1]
    upper = np.triu(np.ones((n, n), dtype=bool))
    return np.where(upper, array, np.swapaxes(array, -1, -2))


def _positive_definite(draw: Callable[..., Any], name: str, shape: tuple[int, ...]) -> Any:
    from jaxstruct.core.constraints import positive_definite

    n = shape[-1]
    factor = draw(array_strategy("float64", shape, _UNIT))
    shift = draw(_SHIFT)
    dtype = _numpy_dtype(name)
    for _ in range(40):
        matrix = factor @ np.swapaxes(factor, -1, -2) + shift * np.eye(n)
        value = _mirror(matrix.astype(dtype))
        if positive_definite(value):
            return value
        shift *= 2  # a low-precision dtype rounded the matrix out of definiteness
    return None


def _simplex(draw: Callable[..., Any], name: str, shape: tuple[int, ...]) -> Any:
    from jaxstruct.core.constraints import simplex

    dtype = _numpy_dtype(name)
    k = shape[-1]
    if _is_exact(name):
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        picks = draw(st.lists(st.integers(0, k - 1), min_size=rows, max_size=rows))
        value = np.eye(k, dtype=np.int64)[np.asarray(picks, dtype=np.int64)]
        return value.reshape(shape).astype(dtype)
    weights = draw(array_strategy("float64", shape, _WEIGHT))
    sums = weights.sum(axis=-1, keepdims=True)
    weights = np.where(sums > 0, weights, 1.0)  # all zero: uniform
    value = (weights / weights.sum(axis=-1, keepdims=True)).astype(dtype)
    return value if simplex(value) else None


def values_for(draw: Callable[..., Any], name: str, shape: tuple[int, ...], checks: Checks) -> Any:
    """A NumPy array of dtype ``name`` and ``shape`` satisfying ``checks``, or ``None`` if none.

    ``None`` only when the shape rules the structure out (a simplex of no
    entries); the caller discards the draw, saying why.
    """
    structure = checks.structure
    if structure == "positive_definite":
        return _positive_definite(draw, name, shape)
    if structure == "simplex":
        return _simplex(draw, name, shape) if shape[-1] > 0 else None
    finite_only = checks.finite
    full = _elements(name, checks, finite_only=False)
    if not finite_only and checks.validated:
        finite = _elements(name, checks, finite_only=True)
        # Nine arrays in ten finite (a validator reading values mostly accepts),
        # the tenth as the field allows; shrinking goes to the finite side.
        finite_only = finite is not full and draw(_TENTHS) < FINITE_SHARE
    elements = _elements(name, checks, True) if finite_only else full
    value = _plain(draw, name, shape, elements)
    if structure == "symmetric":
        value = _mirror(value)
    return value
