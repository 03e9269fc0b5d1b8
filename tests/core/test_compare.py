"""Equality and hashing: array fields, jit, dict keys, static arguments."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest


class Cfg(js.Struct):
    n: int = js.field(static=True, default=1)
    name: str = "a"


class Arr(js.Struct):
    a: object


# -- hashing -------------------------------------------------------------------------


def test_equal_instances_hash_equal() -> None:
    """Equal instances with hashable values have equal hashes."""
    assert hash(Cfg(2, "x")) == hash(Cfg(2, "x"))


def test_instances_usable_as_dict_keys() -> None:
    """Hashable instances work as dict keys."""
    table = {Cfg(1): "one", Cfg(2): "two"}
    assert table[Cfg(2)] == "two"


def test_instances_usable_in_sets() -> None:
    """Equal instances collapse in a set."""
    assert len({Cfg(1), Cfg(1), Cfg(2)}) == 2


def test_hash_depends_on_type() -> None:
    """Instances of different classes with the same values hash differently."""

    class Other(js.Struct):
        n: int = js.field(static=True, default=1)
        name: str = "a"

    assert hash(Cfg()) != hash(Other())


def test_unhashable_field_raises_type_error_naming_field() -> None:
    """hash() of an instance with a list field raises TypeError naming the field."""
    with pytest.raises(TypeError, match=r"'a'.*list"):
        hash(Arr([1, 2]))


def test_array_field_makes_instance_unhashable() -> None:
    """hash() of an instance holding an array raises TypeError naming the field."""
    with pytest.raises(TypeError, match="'a'"):
        hash(Arr(jnp.ones(2)))


def test_unhashable_compare_false_field_is_ignored_by_hash() -> None:
    """A compare=False field never makes hash() fail."""

    class P(js.Struct):
        x: int
        cache: object = js.field(pytree=False, compare=False, default_factory=dict)

    assert hash(P(1)) == hash(P(1))


def test_instance_as_jit_static_argument() -> None:
    """A hashable instance works as a jit static argument."""
    f = jax.jit(lambda x, c: x * c.n, static_argnums=1)
    assert float(f(2.0, Cfg(n=3))) == 6.0


def test_equal_static_argument_does_not_retrace() -> None:
    """An equal static argument reuses the compiled function; a different one retraces."""
    traces: list[int] = []

    def body(x: jax.Array, c: Cfg) -> jax.Array:
        traces.append(c.n)
        return x * c.n

    f = jax.jit(body, static_argnums=1)
    f(1.0, Cfg(n=3))
    f(1.0, Cfg(n=3))
    assert traces == [3]
    f(1.0, Cfg(n=4))
    assert traces == [3, 4]


def test_nested_struct_hash() -> None:
    """A struct holding a hashable struct is hashable."""

    class Outer(js.Struct):
        inner: Cfg

    assert hash(Outer(Cfg(2))) == hash(Outer(Cfg(2)))


# -- equality ------------------------------------------------------------------------


def test_eq_same_values() -> None:
    """Instances with equal field values are equal."""
    assert Cfg(2, "x") == Cfg(2, "x")


def test_eq_different_values() -> None:
    """Instances with different values are not equal."""
    assert Cfg(2, "x") != Cfg(3, "x")


def test_eq_different_classes() -> None:
    """Instances of different classes are never equal."""

    class Sub(Cfg):
        pass

    assert Cfg() != Sub()


def test_eq_with_non_struct() -> None:
    """Comparing with a non-struct is False, not an error."""
    assert Cfg() != (1, "a")


def test_eq_with_equal_arrays() -> None:
    """Array fields compare by value."""
    assert Arr(jnp.ones(3)) == Arr(jnp.ones(3))


def test_eq_with_different_arrays() -> None:
    """Arrays with different values compare unequal, returning a bool."""
    result = Arr(jnp.ones(3)) == Arr(jnp.zeros(3))
    assert result is False


def test_eq_with_different_shapes_does_not_raise() -> None:
    """Arrays of different shapes compare unequal without broadcasting errors."""
    assert Arr(jnp.ones(3)) != Arr(jnp.ones(4))


def test_eq_with_different_dtypes() -> None:
    """Arrays of different dtypes compare unequal."""
    assert Arr(jnp.ones(3, jnp.float32)) != Arr(jnp.ones(3, jnp.int32))


def test_eq_numpy_and_jax_arrays() -> None:
    """A NumPy array and a JAX array with the same values and dtype compare equal."""
    assert Arr(np.ones(2, np.float32)) == Arr(jnp.ones(2, jnp.float32))


def test_eq_nan_arrays() -> None:
    """Arrays holding NaN at the same positions compare equal (bitwise-like)."""
    assert Arr(jnp.array([jnp.nan, 1.0])) == Arr(jnp.array([jnp.nan, 1.0]))


def test_eq_arrays_inside_containers() -> None:
    """Arrays nested in lists and dicts compare by value."""
    assert Arr({"k": [jnp.ones(2)]}) == Arr({"k": [jnp.ones(2)]})
    assert Arr({"k": [jnp.ones(2)]}) != Arr({"k": [jnp.zeros(2)]})


def test_eq_container_structure_differs() -> None:
    """Containers of different structure compare unequal."""
    assert Arr([1, 2]) != Arr([1, 2, 3])
    assert Arr([1, 2]) != Arr((1, 2))


def test_eq_nested_struct_ignores_its_compare_false_fields() -> None:
    """A nested struct is compared by its own ==, so its compare=False fields are ignored."""

    class Inner(js.Struct):
        x: int
        note: str = js.field(static=True, compare=False, default="")

    class Outer(js.Struct):
        inner: Inner

    assert Outer(Inner(1, "a")) == Outer(Inner(1, "b"))


def test_eq_nested_struct_in_list_ignores_compare_false_fields() -> None:
    """Structs inside containers are compared by their own == as well."""

    class Inner(js.Struct):
        x: int
        h: object = js.field(pytree=False, compare=False, default_factory=object)

    assert Arr([Inner(1)]) == Arr([Inner(1)])


def test_eq_under_jit_answers_what_is_known() -> None:
    """== inside jit is True for the very same struct and False for different shapes."""
    results: list[object] = []

    @jax.jit
    def f(a: Arr, b: Arr) -> jax.Array:
        results.append(a == b)
        results.append(a == a)  # noqa: PLR0124 - identity must compare equal
        return a.a

    f(Arr(jnp.ones(2)), Arr(jnp.ones(3)))
    assert results == [False, True]


def test_eq_with_tracer_and_concrete_under_jit_is_an_error() -> None:
    """Comparing a traced struct with a concrete one of equal shape names tree_equal."""
    concrete = Arr(jnp.ones(2))

    @jax.jit
    def f(a: Arr) -> jax.Array:
        return jnp.asarray(a == concrete)

    with pytest.raises(js.TracedComparisonError, match=r"Arr == Arr: field 'a'.*tree_equal"):
        f(Arr(jnp.ones(2)))


def test_eq_field_whose_eq_raises() -> None:
    """A field value whose == raises makes the structs unequal, not an error."""

    class Weird:
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no")

        __hash__ = object.__hash__

    assert Arr(Weird()) != Arr(Weird())


def test_eq_and_hash_consistent_for_int_and_float() -> None:
    """1 == 1.0 field values give equal instances with equal hashes."""
    assert Cfg(1) == Cfg(1.0)  # type: ignore[arg-type]
    assert hash(Cfg(1)) == hash(Cfg(1.0))  # type: ignore[arg-type]


def test_eq_unflattened_copy() -> None:
    """An instance rebuilt by tree_map(identity) equals the original."""
    a = Arr({"w": jnp.arange(3)})
    assert jax.tree_util.tree_map(lambda v: v, a) == a


# -- typed PRNG keys -----------------------------------------------------------------


class Keyed(js.Struct):
    key: jax.Array
    w: jax.Array


def test_typed_keys_compare_by_implementation_and_key_data() -> None:
    """== and tree_equal compare typed PRNG keys by implementation and key data."""
    a = Keyed(key=jax.random.key(0), w=jnp.ones(2))
    assert a == Keyed(key=jax.random.key(0), w=jnp.ones(2))
    assert a != Keyed(key=jax.random.key(1), w=jnp.ones(2))
    assert a != Keyed(key=jax.random.key(0, impl="rbg"), w=jnp.ones(2))
    assert a != Keyed(key=jax.random.split(jax.random.key(0), 1), w=jnp.ones(2))
    assert js.tree_equal(a, Keyed(key=jax.random.key(0), w=jnp.ones(2))) is True
    assert js.tree_equal(a, Keyed(key=jax.random.key(1), w=jnp.ones(2))) is False


def test_typed_keys_compare_under_jit() -> None:
    """tree_equal under jit compares traced typed keys by their key data."""
    same, other = jax.random.key(3), jax.random.key(4)
    assert bool(jax.jit(js.tree_equal)(Keyed(same, jnp.ones(1)), Keyed(same, jnp.ones(1))))
    assert not bool(jax.jit(js.tree_equal)(Keyed(same, jnp.ones(1)), Keyed(other, jnp.ones(1))))
