"""structs() makes valid values by construction: validators, converters, annotated bounds."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import jaxstruct.core as js
import jaxstruct.testing._strategies as strategies_module
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxstruct.testing import structs
from jaxstruct.testing._arrays import floats_of_width
from jaxtyping import Array, Float

# Deterministic runs with every health check on: a rejection-heavy strategy fails them.
STRICT = settings(max_examples=60, derandomize=True, database=None, deadline=None)


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Annotation metadata with annotated_types' attribute names."""

    ge: float | None = None
    lt: float | None = None


class Hyper(js.Struct):
    lr: float = js.field(validator=lambda v: v > 0)
    steps: int = js.field(validator=lambda n: n >= 1)
    momentum: float = js.field(validator=lambda m: 0 <= m < 1)
    warmup: int = js.field(validator=lambda n: 0 <= n <= 10)


def test_comparison_validators_pass_strict_health_checks() -> None:
    """Four fields with comparison validators: no filter_too_much, every value valid."""

    @STRICT
    @given(structs(Hyper))
    def check(h: Hyper) -> None:
        assert h.lr > 0 and h.steps >= 1 and 0 <= h.momentum < 1 and 0 <= h.warmup <= 10

    check()


class StaticHyper(js.Struct):
    p: float = js.field(static=True, validator=lambda p: 0 <= p < 1)
    q: float = js.field(static=True, validator=lambda q: 0 <= q < 1)
    n: int = js.field(static=True, validator=lambda n: 1 <= n <= 4)


def test_comparison_validators_bound_static_fields() -> None:
    """Static fields' comparison validators bound their draws, as node fields' do."""

    @STRICT
    @given(structs(StaticHyper))
    def check(h: StaticHyper) -> None:
        assert 0 <= h.p < 1 and 0 <= h.q < 1 and 1 <= h.n <= 4

    check()


def test_documented_example_rejects_no_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' Batch example (a validated field) never discards a whole instance."""

    class Batch(js.Struct):
        x: Float[Array, "n 3"]  # noqa: F722
        weight: float = js.field(default=1.0, validator=lambda w: w >= 0)

    rejected = []
    real_reject = vars(strategies_module)["reject"]

    def counting() -> None:
        rejected.append(1)
        real_reject()

    monkeypatch.setattr(strategies_module, "reject", counting)

    @STRICT
    @given(structs(Batch))
    def check(b: Batch) -> None:
        assert b.weight >= 0

    check()
    assert rejected == []


def test_converter_fields_get_no_complex_arrays() -> None:
    """A converter on an open-dtype array field never receives complex values."""
    kinds: set[str] = set()

    def to_float32(a: Any) -> np.ndarray:
        kinds.add(np.asarray(a).dtype.kind)
        return np.asarray(a, np.float32)

    class Weights(js.Struct):
        w: np.ndarray = js.field(converter=to_float32)

    @STRICT
    @given(structs(Weights))
    def check(x: Weights) -> None:
        assert x.w.dtype == np.float32

    check()
    assert kinds and "c" not in kinds


def test_converter_with_annotated_input_gets_that_type() -> None:
    """A converter whose parameter is annotated is fed values of that type."""
    seen: set[type] = set()

    def from_list(xs: list[int]) -> tuple[int, ...]:
        seen.add(type(xs))
        return tuple(xs)

    class Shape(js.Struct):
        dims: tuple[int, ...] = js.field(static=True, converter=from_list)

    @STRICT
    @given(structs(Shape))
    def check(s: Shape) -> None:
        assert isinstance(s.dims, tuple)

    check()
    assert seen == {list}


def test_unannotated_converter_field_gets_flat_array_likes() -> None:
    """An object field with a converter gets array-likes jnp.asarray accepts, not containers."""
    import jax.numpy as jnp

    class Loose(js.Struct):
        v: object = js.field(converter=jnp.asarray)
        n: int = js.field(converter=int, validator=lambda n: n > 0)

    @STRICT
    @given(structs(Loose))
    def check(x: Loose) -> None:
        assert x.n > 0 and hasattr(x.v, "dtype")

    check()


def test_annotated_bounds_bound_the_draws() -> None:
    """Annotated[float, <ge/lt metadata>] draws only values in the bounds."""

    class Prob(js.Struct):
        p: Annotated[float, Bounds(ge=0.0, lt=1.0)]
        k: Annotated[int, Bounds(ge=2, lt=5)]

    @STRICT
    @given(structs(Prob))
    def check(x: Prob) -> None:
        assert 0.0 <= x.p < 1.0 and 2 <= x.k < 5

    check()


def test_raising_validator_still_constrains() -> None:
    """A validator that raises to refuse (returning None to accept) is honoured per field."""

    def even(n: int) -> None:
        if n % 2:
            raise ValueError("odd")

    class Even(js.Struct):
        n: int = js.field(validator=even)

    @STRICT
    @given(structs(Even))
    def check(x: Even) -> None:
        assert x.n % 2 == 0

    check()


# Half the draws are refused on purpose: the end-of-test report is expected.
@pytest.mark.filterwarnings("ignore::jaxstruct.testing.RefusalWarning")
def test_instance_validators_still_decide_at_construction() -> None:
    """A validator taking the instance is left to construction; its refusals are discarded."""

    class Distinct(js.Struct):
        low: int = js.field(validator=lambda v: 0 <= v <= 1)
        high: int = js.field(validator=lambda self, v: v != self.low)

    @settings(max_examples=30, derandomize=True, database=None, deadline=None)
    @given(structs(Distinct, high=st.integers(0, 1)))
    def check(x: Distinct) -> None:
        assert x.low != x.high

    check()


def test_narrow_floats_never_overflow() -> None:
    """floats_of_width draws fit the width (float16 max, infinities), with no overflow rejection."""

    @STRICT
    @given(floats_of_width(16))
    def check(x: float) -> None:
        assert np.isnan(x) or np.isinf(x) or abs(x) <= 65504.0
        assert np.isnan(x) or float(np.float16(x)) == x

    check()


def test_override_still_wins_over_narrowing() -> None:
    """An override strategy is used as given, even for a validated field."""

    @STRICT
    @given(structs(Hyper, lr=st.just(0.5)))
    def check(h: Hyper) -> None:
        assert h.lr == 0.5

    check()
