"""structs(sizes=..., dtypes=...) and arrays(): which shapes and dtypes are drawn."""

import jax
import jaxstruct.core as js
import numpy as np
import pytest
from hypothesis import given, settings
from jaxstruct.testing import arrays, structs
from jaxtyping import Array, Float, Int, Shaped


class Grid(js.Struct):
    # jaxtyping's shape strings are not forward references (F722 misreads them).
    a: Float[Array, "n m"]  # noqa: F722
    b: Shaped[np.ndarray, " n"]  # noqa: F722


class Holder(js.Struct):
    grid: Grid
    c: Int[Array, " k"]  # noqa: F722


@settings(max_examples=30)
@given(arrays(Float[Array, "n 3"], sizes=range(4, 6), dtypes=["float32"]))
def test_arrays_strategy_draws_the_annotation(x: jax.Array) -> None:
    """arrays() draws the annotation's array type and shape with the options."""
    assert isinstance(x, jax.Array) and x.dtype == np.float32
    assert x.shape[1] == 3 and x.shape[0] in (4, 5)


def test_arrays_rejects_a_non_array_annotation() -> None:
    """arrays(int) is a TypeError saying what it expects."""
    with pytest.raises(TypeError, match="expected an array annotation"):
        arrays(int)


@settings(max_examples=30)
@given(structs(Holder, sizes={"n": 2, "m": (5, 7), "k": 1}, dtypes=("float16", "int8")))
def test_sizes_and_dtypes_options_reach_nested_structs(h: Holder) -> None:
    """Per-name sizes and the dtypes option apply to nested struct fields too."""
    assert h.grid.a.shape[0] == 2 and h.grid.a.shape[1] in (5, 7)
    assert h.grid.a.dtype == np.float16
    assert h.grid.b.shape == (2,) and h.grid.b.dtype in (np.float16, np.int8)
    assert h.c.shape == (1,) and h.c.dtype == np.int8


def test_a_few_sizes_and_dtypes_give_few_shapes() -> None:
    """sizes=(2,) with one dtype draws one signature, so jit compiles are reused."""
    signatures = set()

    @settings(max_examples=40, database=None)
    @given(structs(Grid, sizes=(2,), dtypes="float32"))
    def test(g: Grid) -> None:
        signatures.add(tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(g)))

    test()
    assert signatures == {(((2, 2), "float32"), ((2,), "float32"))}


def test_most_default_draws_are_not_empty() -> None:
    """With the default sizes, most draws of a two-dimensional array hold elements."""
    empty = []

    @settings(max_examples=200, database=None)
    @given(arrays(Float[np.ndarray, "n m"]))
    def test(x: np.ndarray) -> None:
        empty.append(x.size == 0)

    test()
    assert sum(empty) < 0.3 * len(empty)


def test_bad_options_are_type_errors() -> None:
    """A size option of the wrong kind is a TypeError naming it."""
    with pytest.raises(TypeError, match=r"sizes\['n'\]: expected a size"):
        structs(Grid, sizes={"n": 1.5})
    with pytest.raises(TypeError, match="is not a dtype"):
        structs(Grid, dtypes=["float33"])
    with pytest.raises(TypeError, match="expected a strategy, or a function"):
        structs(Grid, a=3)
