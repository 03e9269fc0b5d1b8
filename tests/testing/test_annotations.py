"""structs(): every way users annotate an array field draws arrays; undrawable ones fail early."""

from __future__ import annotations

import abc
import random
import typing

import jax
import jaxstruct.core as js
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxstruct.testing import arrays, structs
from jaxtyping import Array, Float

# What chex.Array is (chex is not installed here): devices arrays, NumPy arrays and scalars.
ChexArray = typing.Union[jax.Array, np.ndarray, np.bool_, np.number]  # noqa: UP007


class Annotated_(js.Struct):
    chex_like: ChexArray
    array_like: jax.typing.ArrayLike
    with_number: np.ndarray | np.number
    numpy_only: np.ndarray | np.floating
    jaxtyped: Float[Array, " n"] | np.ndarray  # noqa: F722
    maybe: ChexArray | None = None
    scalar: np.number = js.field(default_factory=lambda: np.float32(0))


@settings(max_examples=40, database=None, deadline=None)
@given(structs(Annotated_))
def test_array_annotations_draw_arrays(x: Annotated_) -> None:
    """chex.Array-like unions, ArrayLike and unions with np.number draw arrays, not scalars."""
    for value in (x.chex_like, x.array_like, x.with_number, x.jaxtyped):
        assert isinstance(value, np.ndarray | jax.Array), value
    assert isinstance(x.numpy_only, np.ndarray)
    assert x.maybe is None or isinstance(x.maybe, np.ndarray | jax.Array)
    assert isinstance(x.scalar, np.number)


class _Handle(abc.ABC):
    """Abstract, with no concrete subclass: no value of it can be drawn, on any Python.

    (A class whose __init__ takes a threading.Lock is drawable from Python 3.13 on,
    where threading.Lock is a class Hypothesis can build.)"""

    @abc.abstractmethod
    def close(self) -> None: ...


class Undrawable(js.Struct):
    w: np.ndarray
    thing: _Handle


def test_undrawable_annotation_is_refused_at_structs_call() -> None:
    """A field no value can be drawn for is a TypeError from structs(), naming class and field."""
    with pytest.raises(TypeError, match=r"structs\(Undrawable\): cannot draw values for field "):
        structs(Undrawable)
    with pytest.raises(TypeError, match="'thing' annotated _Handle"):
        structs(Undrawable)

    class Open(_Handle):
        def close(self) -> None:
            pass

    structs(Undrawable, thing=st.just(Open()))  # the way out


class Typed(js.Struct, typecheck=True):
    shape: tuple[int, ...] = js.field(static=True)
    names: dict[str, int]
    w: Float[Array, " n"]  # noqa: F722


@settings(max_examples=20, database=None, deadline=None)
@given(structs(Typed))
def test_typecheck_draws_leave_the_random_module_alone(x: Typed) -> None:
    """typecheck=True with container fields never moves the global random state.

    (Hypothesis warns when a draw does, an error under warnings-as-errors.)
    """
    random.seed(0)
    expected = random.random()
    random.seed(0)
    x.replace(shape=(*x.shape, 1))  # construction runs the type check again
    assert random.random() == expected


@settings(max_examples=20, database=None, deadline=None)
@given(arrays(jax.typing.ArrayLike, sizes=2), arrays(np.ndarray | np.number, dtypes="int8"))
def test_arrays_takes_array_unions(x: typing.Any, y: typing.Any) -> None:
    """arrays() draws the array members of a union, as structs() does."""
    assert isinstance(x, np.ndarray | jax.Array) and all(n == 2 for n in x.shape)
    assert isinstance(y, np.ndarray) and y.dtype == np.int8
