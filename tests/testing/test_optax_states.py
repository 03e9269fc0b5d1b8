"""optax states and other namedtuples of arrays are drawn by structs() (issue 37)."""

from __future__ import annotations

import typing

import jax
import jaxstruct.core as js
import numpy as np
import pytest
from hypothesis import given, settings
from jaxstruct.testing import structs

# A peer: absent only in the lowest-versions runs (conftest allows the skip there).
optax = pytest.importorskip("optax")


class Point(typing.NamedTuple):
    x: np.ndarray
    y: np.ndarray
    label: str = "p"


class OptimiserState(js.Struct):
    adam: optax.ScaleByAdamState
    chain: tuple[optax.ScaleByAdamState, optax.EmptyState, optax.EmptyState]
    point: Point


@settings(max_examples=20, database=None, deadline=None)
@given(structs(OptimiserState))
def test_optax_states_and_named_tuples_are_drawn(x: OptimiserState) -> None:
    """optax's states (forward references in their annotations) and namedtuples are drawn."""
    assert type(x.adam) is optax.ScaleByAdamState
    assert isinstance(x.adam.mu, np.ndarray | jax.Array)
    assert [type(s) for s in x.chain] == [
        optax.ScaleByAdamState,
        optax.EmptyState,
        optax.EmptyState,
    ]
    assert type(x.point) is Point and isinstance(x.point.x, np.ndarray)
    assert isinstance(x.point.label, str)
