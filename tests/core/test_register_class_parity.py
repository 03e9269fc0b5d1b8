"""register_class on dataclasses and flax/optree conventions (issue 11, items 3 and 11)."""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jaxstruct.core as js


def test_dataclass_init_false_keeps_its_own_init() -> None:
    """A @dataclass(init=False) class keeps its own __init__ when registered."""

    @js.register_class
    @dataclasses.dataclass(init=False)
    class Pair:
        a: int
        b: int

        def __init__(self, both: int) -> None:
            self.a = both
            self.b = both + 1

    pair = Pair(3)  # type: ignore[call-arg]
    assert (pair.a, pair.b) == (3, 4)


def test_dataclass_with_initvar_is_buildable() -> None:
    """A dataclass with an InitVar registers to a struct whose __post_init__ gets it."""

    @js.register_class
    @dataclasses.dataclass
    class Offset:
        a: int
        by: dataclasses.InitVar[int] = 0

        def __post_init__(self, by: int) -> None:
            self.a = self.a + by

    assert Offset(1, 5).a == 6
    assert Offset(1).a == 1
    assert list(js.fields(Offset)) == ["a"]


def test_dataclass_pytree_node_false_is_static() -> None:
    """metadata={"pytree_node": False} (flax, optree) makes a field static."""

    @js.register_class
    @dataclasses.dataclass
    class Layer:
        w: float
        size: int = dataclasses.field(default=3, metadata={"pytree_node": False})

    assert Layer.static_fields() == ("size",)
    assert jax.tree_util.tree_leaves(Layer(1.0)) == [1.0]


def test_dataclass_static_metadata_is_static() -> None:
    """metadata={"static": True} (equinox) still makes a field static."""

    @js.register_class
    @dataclasses.dataclass
    class Layer:
        w: float
        size: int = dataclasses.field(default=3, metadata={"static": True})

    assert Layer.static_fields() == ("size",)


def test_pytree_node_true_stays_a_node() -> None:
    """metadata={"pytree_node": True} leaves the field a node."""

    @js.register_class
    @dataclasses.dataclass
    class Layer:
        w: float = dataclasses.field(default=1.0, metadata={"pytree_node": True})

    assert Layer.node_fields() == ("w",)


def test_plain_class_with_dataclasses_field() -> None:
    """dataclasses.field(...) on a plain class registers as the matching struct field."""

    @js.register_class
    class Layer:
        w: float
        size: int = dataclasses.field(default=2, metadata={"pytree_node": False})

    assert Layer.static_fields() == ("size",)
    assert Layer(1.0).size == 2


def test_register_class_kw_only() -> None:
    """register_class(kw_only=True) makes the class's fields keyword-only."""

    @js.register_class(kw_only=True)
    class Opts:
        a: int
        b: int = 0

    assert str(inspect.signature(Opts)) == "(*, a: int, b: int = 0) -> None"
