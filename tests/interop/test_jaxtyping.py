"""Structs inside jaxtyping ``PyTree[...]`` annotations (reference 001)."""

# jaxtyping's dimension strings ("n m", "T") look like forward references to pyflakes.
# ruff: noqa: F722, F821

# No `from __future__ import annotations`: the annotations below are evaluated
# at definition, as jaxtyping users write them.

import jax.numpy as jnp
import jaxstruct.core as js
import pytest

jaxtyping = pytest.importorskip("jaxtyping")
beartype = pytest.importorskip("beartype")

from jaxtyping import Array, Float, Int, PyTree, Shaped, TypeCheckError, jaxtyped  # noqa: E402

typechecked = jaxtyped(typechecker=beartype.beartype)


class Pair(js.Struct):
    a: object
    b: object
    tag: str = js.field(static=True, default="p")


class Other(js.Struct):
    a: object
    b: object


@typechecked
def leaves_float(x: PyTree[Float[Array, "n"]]) -> None:
    pass


@typechecked
def same_structure(x: PyTree[Float[Array, "n"], "T"], y: PyTree[Float[Array, "n"], "T"]) -> None:
    pass


@typechecked
def composite(x: PyTree[int, "T"], y: PyTree[int, "S"], z: PyTree[int, "S T"]) -> None:
    pass


@typechecked
def suffix(x: PyTree[int, "T"], z: PyTree[int, "... T"]) -> None:
    pass


@typechecked
def prefix(x: PyTree[int, "T"], z: PyTree[int, "T ..."]) -> None:
    pass


@typechecked
def path_dependent(
    x: PyTree[Shaped[Array, "?foo"], "T"], y: PyTree[Shaped[Array, "?foo"], "T"]
) -> None:
    pass


def test_leaf_types_pass() -> None:
    """PyTree[Float[Array, "n"]] accepts a struct whose leaves all match."""
    leaves_float(Pair(a=jnp.ones(3), b=jnp.zeros(3)))


def test_leaf_types_fail() -> None:
    """A struct leaf of the wrong dtype fails PyTree[Float[...]]."""
    with pytest.raises(TypeCheckError):
        leaves_float(Pair(a=jnp.ones(3), b=jnp.zeros(3, dtype=jnp.int32)))


def test_leaf_shape_binding_fails() -> None:
    """Dimension n binds across the leaves of one struct."""
    with pytest.raises(TypeCheckError):
        leaves_float(Pair(a=jnp.ones(3), b=jnp.zeros(4)))


def test_static_and_opaque_not_checked_as_leaves() -> None:
    """Static fields are structure, not leaves: a str static passes PyTree[Float[...]]."""
    leaves_float(Pair(a=jnp.ones(2), b=jnp.ones(2), tag="anything"))


def test_structure_name_binds_across_arguments() -> None:
    """Two structs of the same class and static values share structure T."""
    same_structure(Pair(a=jnp.ones(2), b=jnp.ones(2)), Pair(a=jnp.zeros(2), b=jnp.zeros(2)))


def test_structure_name_fails_on_other_class() -> None:
    """A struct of another class has another structure."""
    with pytest.raises(TypeCheckError):
        same_structure(Pair(a=jnp.ones(2), b=jnp.ones(2)), Other(a=jnp.ones(2), b=jnp.ones(2)))


def test_structure_name_fails_on_other_static() -> None:
    """A different static field value is a different structure."""
    with pytest.raises(TypeCheckError):
        same_structure(
            Pair(a=jnp.ones(2), b=jnp.ones(2)), Pair(a=jnp.ones(2), b=jnp.ones(2), tag="q")
        )


def test_composite_structure_passes() -> None:
    """z may be the composition S of T: a dict of structs."""
    composite(Pair(a=1, b=2), {"key": 3}, {"key": Pair(a=4, b=5)})


def test_composite_structure_fails() -> None:
    """A z that is not S composed with T fails."""
    with pytest.raises(TypeCheckError):
        composite(Pair(a=1, b=2), {"key": 3}, {"key": (4, 5)})


def test_leading_ellipsis_passes() -> None:
    """'... T' accepts any upper levels above structs matching T."""
    suffix(Pair(a=1, b=2), [Pair(a=3, b=4), Pair(a=5, b=6)])


def test_leading_ellipsis_fails() -> None:
    """'... T' rejects lower levels that are not T."""
    with pytest.raises(TypeCheckError):
        suffix(Pair(a=1, b=2), [(3, 4)])


def test_trailing_ellipsis_passes() -> None:
    """'T ...' accepts a struct whose children are deeper trees."""
    prefix(Pair(a=1, b=2), Pair(a=(3, 4), b=[5]))


def test_trailing_ellipsis_fails() -> None:
    """'T ...' rejects a tree that does not start with T."""
    with pytest.raises(TypeCheckError):
        prefix(Pair(a=1, b=2), (3, 4))


def test_path_dependent_sizes_pass() -> None:
    """'?foo' sizes may differ between fields but must match leaf for leaf."""
    x = Pair(a=jnp.arange(3), b=jnp.arange(5))
    y = Pair(a=jnp.arange(3) + 1, b=jnp.arange(5) + 1)
    path_dependent(x, y)


def test_path_dependent_sizes_fail() -> None:
    """Corresponding leaves of different sizes fail '?foo'."""
    x = Pair(a=jnp.arange(5), b=jnp.arange(5))
    y = Pair(a=jnp.arange(3), b=jnp.arange(5))
    with pytest.raises(TypeCheckError):
        path_dependent(x, y)


def test_int_leaves_in_struct() -> None:
    """A struct field annotation can itself be a PyTree of jaxtyping arrays."""

    @typechecked
    def f(x: PyTree[Int[Array, ""]]) -> None:
        pass

    f(Pair(a=jnp.int32(1), b=[jnp.int32(2)]))
    with pytest.raises(TypeCheckError):
        f(Pair(a=jnp.float32(1), b=[jnp.int32(2)]))
