"""structs() and arrays() build values satisfying constraints and bounds, never by filtering."""

# ruff: noqa: F722 (jaxtyping shape strings are not forward references)
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Annotated, Any

import annotated_types as at
import jax
import jaxstruct.core as js
import jaxstruct.testing._strategies as strategies_module
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import FailedHealthCheck
from jaxstruct.core.constraints import (
    bounded,
    finite,
    positive,
    positive_definite,
    simplex,
    symmetric,
)
from jaxstruct.testing import arrays, structs
from jaxstruct.testing._refusals import health_note, reset_refusals
from jaxtyping import Array, Float, Int, Shaped

# Every health check on, deterministic: a filter-heavy draw fails them.
STRICT = settings(max_examples=60, derandomize=True, database=None, deadline=None)


@pytest.fixture(autouse=True)
def no_filtering(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fail any test here in which structs() discards a whole instance."""
    discarded: list[str] = []
    real = vars(strategies_module)["reject"]

    def counting() -> None:
        discarded.append("instance")
        real()

    monkeypatch.setattr(strategies_module, "reject", counting)
    yield discarded
    assert discarded == [], "structs() discarded instances it should have drawn valid"


def _as64(x: Any) -> np.ndarray:
    """``x`` as float64 (a NaN of a narrow float casts with a RuntimeWarning otherwise)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(x).astype(np.float64)


def _each(strategy: st.SearchStrategy[Any], check: Any, **kw: Any) -> None:
    @settings(STRICT, **kw)
    @given(strategy)
    def run(x: Any) -> None:
        check(x)

    run()


class Bounded(js.Struct):
    w: Annotated[Float[Array, "n n"], at.Ge(-1), at.Le(1)]
    p: Annotated[Shaped[np.ndarray, " n"], at.Interval(gt=0, lt=1)]
    k: Annotated[Int[np.ndarray, " n"], at.Ge(2), at.Lt(5)]


def test_annotated_types_bound_every_element() -> None:
    """Ge/Le/Gt/Lt/Interval on an array annotation bound every element, in every dtype."""

    def check(x: Bounded) -> None:
        assert np.all(np.abs(_as64(x.w)) <= 1)
        assert np.all((_as64(x.p) > 0) & (_as64(x.p) < 1))
        assert np.all((x.k >= 2) & (x.k < 5))

    _each(structs(Bounded), check)


class Covariances(js.Struct):
    cov: Annotated[Float[Array, "n n"], positive_definite]
    sym: Float[np.ndarray, "b n n"] = js.field(validator=symmetric)
    probs: Float[Array, "b k"] = js.field(validator=simplex)
    mean: Float[Array, " n"] = js.field(validator=finite)
    scale: float = js.field(default=1.0, validator=positive)


def test_constraints_are_drawn_directly() -> None:
    """Covariances, symmetric batches, probability rows, finite means: every draw valid."""

    def check(x: Covariances) -> None:
        assert positive_definite(x.cov) and symmetric(x.sym) and simplex(x.probs)
        assert finite(x.mean) and x.scale > 0

    _each(structs(Covariances), check)


def test_constraints_hold_in_low_precision_dtypes() -> None:
    """bfloat16 and float16 covariances and probabilities satisfy the class's own checks."""

    def check(x: Covariances) -> None:
        assert x.cov.dtype == x.probs.dtype
        assert positive_definite(x.cov) and simplex(x.probs)

    for dtype in ("bfloat16", "float16"):
        _each(structs(Covariances, dtypes=dtype, sizes=3), check, max_examples=15)


def test_unshaped_annotations_get_square_matrices() -> None:
    """np.ndarray with positive_definite: square matrices (maybe batched) are drawn."""

    class Loose(js.Struct):
        cov: np.ndarray = js.field(validator=positive_definite)
        probs: np.ndarray = js.field(validator=simplex)

    def check(x: Loose) -> None:
        assert x.cov.ndim >= 2 and x.cov.shape[-1] == x.cov.shape[-2]
        assert x.cov.dtype.kind == "f" or x.cov.dtype == ml_dtypes.bfloat16
        assert x.probs.shape[-1] >= 1

    _each(structs(Loose), check)


def test_a_simplex_axis_is_never_empty() -> None:
    """The axis a simplex sums over gets at least one entry, even when 0 is a likely size."""

    class Mixture(js.Struct):
        weights: Annotated[Float[Array, " k"], simplex]
        means: Float[Array, " k"]

    _each(structs(Mixture, sizes=(0, 1)), lambda x: simplex(x.weights))


def test_integer_simplex_is_one_hot() -> None:
    """An integer annotation with simplex draws one-hot rows."""

    class Choice(js.Struct):
        picks: Annotated[Int[np.ndarray, "b k"], simplex]

    _each(structs(Choice), lambda x: simplex(x.picks) and np.all((x.picks == 0) | (x.picks == 1)))


def _finite_validator(x: Any) -> bool:
    return bool(np.all(np.isfinite(_as64(x))))


class Inner(js.Struct):
    mean: Float[Array, " n"] = js.field(validator=_finite_validator)
    cov: Float[Array, "n n"] = js.field(validator=_finite_validator)


class Middle(js.Struct):
    weights: Float[Array, "m n"] = js.field(validator=_finite_validator)
    bias: Float[Array, " m"] = js.field(validator=_finite_validator)


class Outer(js.Struct):
    inner: Inner
    middle: Middle
    noise: Float[Array, " m"] = js.field(validator=_finite_validator)


@pytest.mark.parametrize("which", range(10))
def test_plain_finite_validators_pass_the_health_checks(which: int) -> None:
    """Five fields with a hand-written finite validator: no filter_too_much on any seed."""

    @seed(which)
    @settings(max_examples=20, database=None, deadline=None)
    @given(structs(Outer))
    def run(x: Outer) -> None:
        assert _finite_validator(x.noise)

    run()


def test_validated_fields_still_reach_nan() -> None:
    """A validator that accepts NaN still sees NaN drawn (one array in ten may hold one)."""

    class Anything(js.Struct):
        w: Float[np.ndarray, " n"] = js.field(validator=lambda w: w.ndim == 1)

    found = find(structs(Anything, sizes=3), lambda x: bool(np.isnan(_as64(x.w)).any()))
    assert np.isnan(_as64(found.w)).any()


def test_finite_fields_never_draw_nan() -> None:
    """finite as a validator: no NaN or infinity in any draw."""

    class Clean(js.Struct):
        w: Float[np.ndarray, " n"] = js.field(validator=finite)

    _each(structs(Clean, sizes=4), lambda x: finite(x.w), max_examples=100)


def test_impossible_constraint_is_refused_when_structs_is_called() -> None:
    """A constraint no dtype or shape of the annotation can hold is a TypeError naming the field."""

    class IntCov(js.Struct):
        cov: Annotated[Int[np.ndarray, "n n"], positive_definite]

    class FlatCov(js.Struct):
        cov: Annotated[Float[np.ndarray, " n"], positive_definite]

    with pytest.raises(TypeError, match=r"IntCov\): cannot draw values for field 'cov'.*no dtype"):
        structs(IntCov)
    with pytest.raises(TypeError, match=r"field 'cov'.*no shape \(n\) holds a positive_definite"):
        structs(FlatCov)


def test_arrays_takes_bounds() -> None:
    """arrays(min_value=, max_value=) bounds every element."""
    _each(
        arrays(Float[Array, "n 3"], min_value=-2, max_value=0.5),
        lambda x: bool(np.all((_as64(x) >= -2) & (_as64(x) <= 0.5))),
    )


def test_arrays_takes_elements() -> None:
    """arrays(elements=) draws its elements from the strategy."""
    _each(
        arrays(Float[np.ndarray, " n"], dtypes="float32", elements=st.sampled_from([0.5, 1.5])),
        lambda x: set(np.unique(x).tolist()) <= {0.5, 1.5},
    )


def test_arrays_reads_annotated_constraints() -> None:
    """arrays(Annotated[..., positive_definite]) draws covariances."""
    _each(arrays(Annotated[Float[Array, "n n"], positive_definite]), positive_definite)


def test_arrays_refuses_elements_with_bounds() -> None:
    """elements= with min_value= is refused: bound the elements strategy itself."""
    with pytest.raises(TypeError, match="bound the elements strategy itself"):
        arrays(Float[Array, " n"], elements=st.floats(0, 1), min_value=0)


def test_bounds_round_inward_for_low_precision() -> None:
    """Bounds not on a dtype's grid (0.1 in float16) round inward: no draw lands outside."""

    class Tight(js.Struct):
        w: Annotated[Float[np.ndarray, " n"], bounded(0.1, 0.3, exclude_hi=True)]

    def check(x: Tight) -> None:
        values = _as64(x.w)
        assert np.all((values >= 0.1) & (values < 0.3)), (x.w.dtype, values)

    for dtype in ("float16", "bfloat16", "float32"):
        _each(structs(Tight, dtypes=dtype, sizes=4), check, max_examples=30)


def _huge(w: Any) -> bool:
    return bool(np.all(_as64(w) > 1e30)) and w.size > 0


class Picky(js.Struct):
    w: Float[Array, " n"] = js.field(validator=_huge)


def test_field_filter_refusals_name_class_field_and_check() -> None:
    """A field filter refusing nearly all draws: the health note names class, field, validator."""
    reset_refusals()

    @settings(max_examples=20, database=None, deadline=None)
    @given(structs(Picky, sizes=3))
    def run(x: Picky) -> None:
        pass

    with pytest.raises(FailedHealthCheck):
        run()
    note = health_note()
    reset_refusals()
    assert note is not None
    assert "structs() discarded values its fields refused: Picky" in note
    assert "Picky.w: validator '_huge' rejected " in note


def test_bounded_scalars_are_drawn_inside() -> None:
    """bounded() on float and int fields bounds their draws (static fields too)."""

    class Rates(js.Struct):
        lr: float = js.field(validator=bounded(0, 1, exclude_lo=True))
        steps: int = js.field(static=True, validator=bounded(1, 8))
        decay: Annotated[float, bounded(0.5, 1)] = 0.9

    def check(x: Rates) -> None:
        assert 0 < x.lr <= 1 and 1 <= x.steps <= 8 and 0.5 <= x.decay <= 1
        assert math.isfinite(x.lr)

    _each(structs(Rates), check, suppress_health_check=[HealthCheck.too_slow])


def test_jax_arrays_satisfy_constraints() -> None:
    """jax.Array fields get JAX arrays satisfying their constraints."""

    class Params(js.Struct):
        cov: Annotated[Float[Array, "n n"], positive_definite]

    _each(structs(Params), lambda x: isinstance(x.cov, jax.Array) and positive_definite(x.cov))
