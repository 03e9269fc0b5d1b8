"""Footguns closed for peers' users (issue 11, items 14-16)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest

# -- 14. mutable defaults -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("default", "factory"),
    [([], "list"), ({}, "dict"), (set(), "set"), (bytearray(), "bytearray")],
)
def test_field_mutable_default_is_refused(default: Any, factory: str) -> None:
    """field(default=[]) (and {}, set(), ...) raises at class definition naming default_factory."""
    with pytest.raises(
        js.StructDefinitionError, match=rf"Bad: field 'items'.*default_factory={factory}\)"
    ):
        type(js.Struct)(
            "Bad",
            (js.Struct,),
            {"__annotations__": {"items": object}, "items": js.field(default=default)},
        )


def test_bare_mutable_default_is_refused() -> None:
    """A bare list default is refused the same way."""
    with pytest.raises(js.StructDefinitionError, match=r"default_factory=list"):

        class Bad(js.Struct):
            items: list = []


def test_any_unhashable_default_is_refused() -> None:
    """An instance of any unhashable class (taken as mutable, as dataclasses do) is refused."""

    class Registry:
        __hash__ = None  # type: ignore[assignment]

    with pytest.raises(js.StructDefinitionError, match=r"mutable Registry.*default_factory"):

        class Bad(js.Struct):
            reg: object = js.field(static=True, default=Registry())


def test_numpy_array_default_is_refused() -> None:
    """A numpy array default (mutable, shared) is refused."""
    with pytest.raises(js.StructDefinitionError, match=r"ndarray.*default_factory"):

        class Bad(js.Struct):
            w: object = np.zeros(2)


def test_jax_array_default_is_accepted() -> None:
    """A JAX array is immutable, so sharing it as a default is safe and allowed."""

    class Ok(js.Struct):
        w: jax.Array = jnp.zeros(2)

    assert Ok().w is Ok().w


def test_hashable_defaults_are_accepted() -> None:
    """Tuples, frozensets and scalars stay fine as defaults."""

    class Ok(js.Struct):
        t: tuple = (1, 2)
        f: frozenset = frozenset()
        n: int = 0

    assert Ok().t == (1, 2)


# -- 15. a converter that raises ----------------------------------------------------------


def _bad(value: Any) -> Any:
    raise ValueError(f"bad value {value}")


class Converted(js.Struct):
    a: int = js.field(converter=_bad, default=0)
    b: int = js.field(default=0)


class Hooked(js.Struct):
    a: int = js.field(converter=_bad, default=0)

    def __post_init__(self) -> None:
        pass


@pytest.mark.parametrize(
    "build",
    [
        lambda: Converted(3),
        lambda: Hooked(3),
        lambda: js.build(Converted, {"a": 3}),
    ],
    ids=["generated init", "init with hooks", "build"],
)
def test_converter_error_names_class_and_field(build: Any) -> None:
    """A converter's exception keeps its type and names the class and field."""
    with pytest.raises(ValueError, match=r"\.a: converter _bad raised ValueError: bad value 3"):
        build()


def test_converter_error_keeps_the_chain() -> None:
    """The original exception is the cause of the one raised."""
    with pytest.raises(ValueError) as info:
        Converted(3)
    assert isinstance(info.value.__cause__, ValueError)
    assert str(info.value.__cause__) == "bad value 3"


def test_converter_error_in_replace_names_class_and_field() -> None:
    """replace() reports a failing converter the same way."""

    class Later(js.Struct):
        a: int = js.field(converter=int)

    obj = Later(1)
    with pytest.raises(ValueError, match=r"Later\.a: converter int raised ValueError"):
        obj.replace(a="x")


def test_converter_error_in_user_init_assignment() -> None:
    """An assignment in a custom __init__ reports a failing converter the same way."""

    class Own(js.Struct):
        a: int = js.field(converter=int)

        def __init__(self, raw: str) -> None:
            self.a = raw

    with pytest.raises(ValueError, match=r"Own\.a: converter int"):
        Own("x")


def test_converter_error_of_unusual_type_gets_a_note() -> None:
    """An exception type that takes no plain message is re-raised as is, with a note."""

    class Picky(Exception):
        def __init__(self, code: int, detail: str) -> None:
            super().__init__(code, detail)

    def convert(value: Any) -> Any:
        raise Picky(7, "no")

    class P(js.Struct):
        a: int = js.field(converter=convert)

    with pytest.raises(Picky) as info:
        P(1)
    assert any("P.a" in note for note in getattr(info.value, "__notes__", []))


# -- 16. == under jit --------------------------------------------------------------------------


class Params(js.Struct):
    w: jax.Array


def test_eq_of_traced_structs_is_a_clear_error() -> None:
    """m == other under jit raises an error naming tree_equal instead of answering False."""

    @jax.jit
    def f(a: Params, b: Params) -> Any:
        return jnp.asarray(a == b)

    with pytest.raises(js.TracedComparisonError, match=r"Params == Params.*'w'.*tree_equal"):
        f(Params(jnp.ones(2)), Params(jnp.ones(2)))


def test_eq_of_struct_with_itself_under_jit() -> None:
    """m == m under jit is True (the very same values)."""

    @jax.jit
    def f(a: Params) -> Any:
        return jnp.asarray(a == a)  # noqa: PLR0124

    assert bool(f(Params(jnp.ones(2))))


def test_eq_of_nested_traced_structs_is_a_clear_error() -> None:
    """A traced struct nested in a list field also raises rather than answering False."""

    class Holder(js.Struct):
        items: list

    @jax.jit
    def f(a: Params, b: Params) -> Any:
        return jnp.asarray(Holder([a]) == Holder([b]))

    with pytest.raises(js.TracedComparisonError):
        f(Params(jnp.ones(2)), Params(jnp.ones(2)))


def test_tree_equal_under_jit_gives_a_traced_answer() -> None:
    """tree_equal returns the right traced boolean inside jit."""
    f = jax.jit(js.tree_equal)
    assert bool(f(Params(jnp.ones(2)), Params(jnp.ones(2))))
    assert not bool(f(Params(jnp.ones(2)), Params(jnp.zeros(2))))


def test_tree_equal_outside_jit_gives_a_bool() -> None:
    """tree_equal outside jit is a Python bool."""
    assert js.tree_equal(Params(jnp.ones(2)), Params(jnp.ones(2))) is True
    assert js.tree_equal(Params(jnp.ones(2)), Params(jnp.ones(3))) is False


def test_tree_equal_different_structure_is_false() -> None:
    """Different tree structures (or static values) are unequal, traced or not."""

    class Tagged(js.Struct):
        w: jax.Array
        tag: str = js.field(static=True, default="a")

    @jax.jit
    def f(a: Tagged, b: Tagged) -> Any:
        return jnp.asarray(js.tree_equal(a, b))

    assert not bool(f(Tagged(jnp.ones(2)), Tagged(jnp.ones(2), tag="b")))


def test_tree_equal_treats_nan_as_equal() -> None:
    """NaN equals NaN, as ==  on structs already does."""
    nan = jnp.array([jnp.nan])
    assert js.tree_equal(Params(nan), Params(nan))
    assert bool(jax.jit(js.tree_equal)(Params(nan), Params(jnp.array([jnp.nan]))))
