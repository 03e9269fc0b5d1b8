"""structs(): valid instances from annotations, overrides, converters and validators."""

import enum
from typing import Literal

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jaxstruct.abc import AbstractVar
from jaxstruct.testing import hashable_values, structs
from jaxtyping import Array, Float, Int, Shaped


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Inner(js.Struct):
    # jaxtyping's shape strings are not forward references (F722 misreads them).
    a: Float[Array, "n 2"]  # noqa: F722
    b: Int[np.ndarray, " n"]  # noqa: F722


class Outer(js.Struct):
    inner: Inner
    xs: list[np.ndarray]
    any_node: object = None
    shape: tuple[int, ...] = js.field(static=True, default=())
    color: Color = js.field(static=True, default=Color.RED)
    mode: Literal["a", "b"] = js.field(static=True, default="a")
    meta: object = js.field(static=True, default=None)


class Checked(js.Struct):
    count: int = js.field(converter=abs)
    rate: float = js.field(validator=lambda v: v >= 0)


@given(structs(Inner))
def test_jaxtyping_dtypes_and_array_kinds(x):
    """jaxtyping annotations give the array type and dtype family they name."""
    assert isinstance(x.a, jax.Array) and jnp.issubdtype(x.a.dtype, jnp.floating)
    assert isinstance(x.b, np.ndarray) and x.b.dtype.kind in "iu"


@given(structs(Inner))
def test_named_dims_agree_across_fields(x):
    """A named dimension has one size across the fields of an instance."""
    assert x.a.shape[0] == x.b.shape[0] and x.a.shape[1] == 2


@given(structs(Outer))
def test_nested_structs_and_containers(x):
    """Nested struct fields hold struct instances, list annotations hold lists of arrays."""
    assert isinstance(x.inner, Inner)
    assert all(isinstance(v, np.ndarray) for v in x.xs)


@given(structs(Outer))
def test_static_values_are_hashable(x):
    """Every static field holds a hashable value; enums and literals come from their members."""
    hash((x.shape, x.color, x.mode, x.meta))
    assert x.color in Color and x.mode in ("a", "b")


@given(structs(Checked))
def test_converters_and_validators_are_respected(x):
    """Draws pass through converters, and draws a validator rejects are discarded."""
    assert x.count >= 0 and x.rate >= 0


@given(structs(Outer, mode=st.just("b")))
def test_overrides_replace_the_inferred_strategy(x):
    """A per-field override decides that field's value."""
    assert x.mode == "b"


def test_override_must_be_a_strategy():
    """A constant instead of a strategy is a TypeError suggesting st.just()."""
    with pytest.raises(TypeError, match=r"st\.just\('b'\)"):
        structs(Outer, mode="b")  # type: ignore[arg-type]


def test_override_must_name_a_field():
    """An override for an unknown name is a TypeError listing the fields."""
    with pytest.raises(TypeError, match="'nope' is not a field"):
        structs(Outer, nope=st.none())


def test_structs_rejects_non_struct():
    """structs() of a plain class is a TypeError."""
    with pytest.raises(TypeError, match="expected a Struct subclass"):
        structs(int)


class Shape(js.Struct):
    sides: AbstractVar[int]


class Square(Shape):
    sides: int = js.field(static=True, default=4)
    size: Shaped[np.ndarray, ""] = js.field(default_factory=lambda: np.zeros(()))  # noqa: F722


@given(structs(Shape))
def test_abstract_class_draws_concrete_subclasses(x):
    """structs() of an abstract class draws instances of its concrete subclasses."""
    assert isinstance(x, Square)


def test_abstract_class_without_subclasses_is_an_error():
    """An abstract class with no concrete subclass cannot be drawn, and says so."""

    class Lonely(js.Struct):
        n: AbstractVar[int]

    with pytest.raises(TypeError, match="no concrete subclass"):
        structs(Lonely)


class WithInit(js.Struct):
    total: int

    def __init__(self, a: int, b: int):
        self.total = a + b


@given(structs(WithInit))
def test_hand_written_init_is_bypassed(x):
    """A struct with its own __init__ is built from field values."""
    assert isinstance(x.total, int)


@given(hashable_values())
def test_hashable_values_hash(value):
    """hashable_values() only produces hashable values."""
    hash(value)


@given(st.from_type(Inner))
def test_from_type_resolves_structs(x):
    """st.from_type() resolves struct classes through the hypothesis entry point."""
    assert isinstance(x, Inner)


@given(st.from_type(Shape))
def test_from_type_of_abstract_base_uses_subclasses(x):
    """st.from_type() of an abstract base draws its registered concrete subclasses."""
    assert isinstance(x, Square)
