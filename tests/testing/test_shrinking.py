"""A failing example shrinks to its smallest shapes: named sizes are drawn before any value."""

# ruff: noqa: F722 (jaxtyping shape strings are not forward references)
from __future__ import annotations

from typing import Annotated

import jaxstruct.core as js
import numpy as np
from hypothesis import find, settings
from hypothesis import strategies as st
from jaxstruct.core.constraints import bounded, positive_definite
from jaxstruct.testing import structs
from jaxtyping import Float

Unit = bounded(-1, 1)


class Model(js.Struct):
    noise: Annotated[Float[np.ndarray, "m m"], positive_definite]
    readout: Annotated[Float[np.ndarray, "m n"], Unit]
    weights: Annotated[Float[np.ndarray, "n n"], Unit]
    state: Annotated[Float[np.ndarray, " n"], Unit]
    steps: Annotated[Float[np.ndarray, "t n"], Unit]


def _transposed_differs(model: Model) -> bool:
    """Where a transposed weight (the bug) gives another answer than the weight itself."""
    return not np.allclose(model.weights.T @ model.state, model.weights @ model.state)


def test_a_transposed_weight_shrinks_to_two_by_two() -> None:
    """The smallest example telling W from W.T has W 2x2, and the other sizes shrink too."""
    found = find(
        structs(Model, dtypes="float64"),
        _transposed_differs,
        settings=settings(database=None, max_examples=200),
    )
    assert found.weights.shape == (2, 2)
    assert found.noise.shape[0] <= 1 and found.steps.shape[0] <= 1  # the others shrink too


def test_sizes_shrink_to_the_smallest_that_fails() -> None:
    """A property failing only for three or more states shrinks to exactly three."""
    found = find(
        structs(Model, dtypes="float32"),
        lambda model: model.state.shape[0] >= 3,
        settings=settings(database=None, max_examples=200),
    )
    assert found.weights.shape == (3, 3) and found.readout.shape[1] == 3


def test_named_sizes_are_drawn_before_any_value() -> None:
    """Every named size of an instance is drawn before its first field value."""
    log: list[str] = []

    def logged(n: int) -> int:
        log.append("size")
        return n

    def seen(_value: object) -> bool:
        log.append("value")
        return True

    class Ordered(js.Struct):
        first: Float[np.ndarray, " n"]
        middle: float = js.field(validator=seen)
        last: Float[np.ndarray, " m"]

    find(
        structs(Ordered, sizes=st.integers(1, 3).map(logged)),
        lambda x: True,
        settings=settings(database=None),
    )
    assert log[:3] == ["size", "size", "value"], log
