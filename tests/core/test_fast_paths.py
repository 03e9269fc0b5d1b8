"""Structural guards for the hot paths (speed itself is measured in benchmarks/)."""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import jaxstruct.core as js


class _Point(js.Struct):
    x: object
    y: object
    tag: str = js.field(static=True, default="p")


def test_no_getattr_fallback_on_struct_classes() -> None:
    """No struct class defines __getattr__: on CPython 3.11 it slows every attribute read."""
    assert all("__getattr__" not in klass.__dict__ for klass in _Point.__mro__)


def test_flatten_is_a_c_level_attrgetter() -> None:
    """JAX flattens a struct through operator.attrgetter, without calling Python code."""
    assert isinstance(js.resolve_pytree_spec(_Point).flatten, operator.attrgetter)


def test_flattened_form_is_current_after_construction_replace_and_unflatten() -> None:
    """The stored (children, aux) pair matches the fields after every way of making an instance."""
    p = _Point(x=jnp.ones(2), y=1.0)
    q = p.replace(tag="q")
    r = jax.tree_util.tree_map(lambda a: a * 2, q)
    for obj in (p, q, r):
        leaves = jax.tree_util.tree_leaves(obj)
        assert len(leaves) == 2 and leaves[1] == obj.y
        assert jax.tree_util.tree_structure(obj) == jax.tree_util.tree_structure(
            _Point(x=obj.x, y=obj.y, tag=obj.tag)
        )


def test_post_init_assignment_after_flatten_is_not_stale() -> None:
    """A field changed in __post_init__ after the instance was flattened is seen by JAX."""

    class Late(js.Struct):
        x: object

        def __post_init__(self) -> None:
            jax.tree_util.tree_leaves(self)  # flattens the half-built instance
            self.x = 5

    assert jax.tree_util.tree_leaves(Late(x=1)) == [5]
