"""Every struct class is a stdlib dataclass in the protocol's sense (issue 11, item 9)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from beartype import beartype
from jaxtyping import Array, Float, TypeCheckError, jaxtyped


class Point(js.Struct):
    x: int
    y: int = js.field(static=True, default=0, metadata={"unit": "px"})
    label: str = js.field(static=True, default="p", compare=False, repr=False)
    twice: int = js.field(static=True, init=False, derived=lambda self: self.x * 2)


def test_is_dataclass_on_class_and_instance() -> None:
    """dataclasses.is_dataclass is true for struct classes and instances."""
    assert dataclasses.is_dataclass(Point)
    assert dataclasses.is_dataclass(Point(1))


def test_struct_base_is_not_a_dataclass() -> None:
    """Struct itself declares no fields and is not a dataclass."""
    assert not dataclasses.is_dataclass(js.Struct)


def test_fields_names_and_order() -> None:
    """dataclasses.fields lists every field, in order."""
    assert [f.name for f in dataclasses.fields(Point)] == ["x", "y", "label", "twice"]


def test_fields_carry_options() -> None:
    """Each Field carries type, default, init, repr, compare and metadata."""
    x, y, label, twice = dataclasses.fields(Point(1))
    assert x.type == "int" and x.default is dataclasses.MISSING and x.init
    assert y.default == 0 and y.metadata["unit"] == "px"
    assert not label.repr and not label.compare
    assert not twice.init


def test_fields_keep_default_factory() -> None:
    """A default_factory is reported as the Field's default_factory."""

    class Bag(js.Struct):
        items: list = js.field(default_factory=list)

    (items,) = dataclasses.fields(Bag)
    assert items.default_factory is list and items.default is dataclasses.MISSING


def test_fields_accept_array_defaults() -> None:
    """A JAX array default (shareable, unlike a dataclass's) still yields Field objects."""

    class W(js.Struct):
        w: jax.Array = jnp.zeros(2)

    (w,) = dataclasses.fields(W)
    assert isinstance(w.default, jax.Array)


def test_fields_list_no_initvar() -> None:
    """InitVars are dataclass pseudo-fields: not in fields(), but in __dataclass_fields__."""

    class S(js.Struct):
        x: int
        k: dataclasses.InitVar[int] = 1

        def __post_init__(self, k: int) -> None:
            pass

    assert [f.name for f in dataclasses.fields(S)] == ["x"]
    assert list(S.__dataclass_fields__) == ["x", "k"]


def test_fields_are_built_once_per_class() -> None:
    """The Field table is made on first use and then reused."""
    assert Point.__dataclass_fields__ is Point.__dataclass_fields__


def test_subclass_has_its_own_fields() -> None:
    """A subclass's table lists its own fields, not its parent's cached table."""

    class Point3(Point):
        z: int = js.field(static=True, default=0)

    assert dataclasses.fields(Point)[-1].name == "twice"
    assert dataclasses.fields(Point3)[-1].name == "z"


def test_dataclass_params_report_frozen() -> None:
    """__dataclass_params__ says the class is frozen with generated eq."""
    params = Point.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen and params.eq and params.init


def test_dataclasses_replace_runs_the_lifecycle() -> None:
    """dataclasses.replace converts, recomputes derived fields and validates."""

    class Checked(js.Struct):
        n: int = js.field(converter=int, validator=lambda v: v >= 0)
        half: float = js.field(static=True, init=False, derived=lambda self: self.n / 2)

    new = dataclasses.replace(Checked(4), n="6")  # type: ignore[arg-type]
    assert (new.n, new.half) == (6, 3.0)
    with pytest.raises(js.ValidationError):
        dataclasses.replace(Checked(4), n=-1)


def test_dataclasses_replace_equals_method_replace() -> None:
    """dataclasses.replace(obj, ...) gives what obj.replace(...) gives."""
    p = Point(1, 2)
    assert dataclasses.replace(p, x=5) == p.replace(x=5)


def test_dataclasses_replace_refuses_derived_field() -> None:
    """A derived field cannot be replaced through dataclasses either."""
    # dataclasses raises ValueError up to Python 3.12 and TypeError from 3.13 on.
    with pytest.raises((ValueError, TypeError), match="twice"):
        dataclasses.replace(Point(1), twice=3)


def test_asdict_and_astuple() -> None:
    """dataclasses.asdict and astuple work, recursing into nested structs."""

    class Line(js.Struct):
        a: Point
        b: Point

    line = Line(Point(1), Point(2, 3))
    assert dataclasses.asdict(line)["b"] == {"x": 2, "y": 3, "label": "p", "twice": 4}
    assert dataclasses.astuple(line) == ((1, 0, "p", 2), (2, 3, "p", 4))


def test_asdict_keeps_arrays() -> None:
    """asdict copies array leaves as arrays."""

    class W(js.Struct):
        w: Any

    out = dataclasses.asdict(W(np.arange(3)))
    assert np.array_equal(out["w"], np.arange(3))


def test_structs_stay_pytrees_with_the_protocol() -> None:
    """Being a dataclass changes nothing about flattening."""
    leaves, treedef = jax.tree_util.tree_flatten(Point(1, 2))
    assert leaves == [1]
    assert jax.tree_util.tree_unflatten(treedef, leaves) == Point(1, 2)


@jaxtyped(typechecker=beartype)
class Layer(js.Struct):
    w: Float[Array, "n m"]  # noqa: F722 - a jaxtyping shape, not a forward reference
    b: Float[Array, " m"]  # noqa: F722


def test_jaxtyped_class_checks_field_types() -> None:
    """@jaxtyped(typechecker=beartype) on a struct class checks constructor arguments."""
    with pytest.raises(TypeCheckError):
        Layer(jnp.ones((2, 3)), 1)  # type: ignore[arg-type]


def test_jaxtyped_class_checks_shared_dimensions() -> None:
    """Dimension names bind across fields, as for a jaxtyped dataclass."""
    Layer(jnp.ones((2, 3)), jnp.ones(3))
    with pytest.raises(TypeCheckError):
        Layer(jnp.ones((2, 3)), jnp.ones(4))


def test_jaxtyped_class_still_builds_and_flattens() -> None:
    """The checked class is still a working struct."""
    layer = Layer(jnp.ones((2, 3)), jnp.ones(3))
    assert jax.tree_util.tree_structure(layer).num_leaves == 2
    assert layer.replace(b=jnp.zeros(3)).b.sum() == 0


def test_built_table_is_held_by_the_class_itself() -> None:
    """Once built, the Field table sits in the class's own __dict__ as a plain dict.

    dataclasses.replace and fields read it twice per call; a descriptor call
    there made a user's dataclasses.replace slower than flax.struct's.
    """

    class Pair(js.Struct):
        a: int
        b: int = 0

    dataclasses.fields(Pair)
    assert type(Pair.__dict__["__dataclass_fields__"]) is dict
    assert dataclasses.replace(Pair(1, 2), b=3) == Pair(1, 3)


def test_subclass_defined_before_the_parent_table_keeps_its_own() -> None:
    """A subclass defined before its parent's table was built never sees the parent's table."""

    class Base(js.Struct):
        a: int

    class Child(Base):
        b: int = 0

    assert [f.name for f in dataclasses.fields(Base)] == ["a"]
    assert [f.name for f in dataclasses.fields(Child)] == ["a", "b"]
    assert dataclasses.replace(Child(1, 2), b=5) == Child(1, 5)
