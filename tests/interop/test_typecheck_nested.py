"""check_types descends into nested structs; type checks leave the global random state alone."""

# jaxtyping's dimension strings ("n n") look like forward references to pyflakes.
# ruff: noqa: F722

import random

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import pytest

pytest.importorskip("jaxtyping")
pytest.importorskip("beartype")

from jaxtyping import Array, Float


class Inner(js.Struct):
    w: Float[Array, "n n"]


class Outer(js.Struct):
    inner: Inner
    more: list[Inner]


def test_check_types_descends_into_nested_structs() -> None:
    """A mismatch in a nested struct, direct or in a list, fails; each binds its own n."""
    js.check_types(Outer(inner=Inner(w=jnp.ones((2, 2))), more=[Inner(w=jnp.ones((3, 3)))]))
    with pytest.raises(js.ValidationError, match=r"Inner\.w: expected Float\[Array, 'n n'\]"):
        js.check_types(Outer(inner=Inner(w=jnp.ones((2, 3))), more=[]))
    with pytest.raises(js.ValidationError, match=r"got array float32\[3,1\]"):
        js.check_types(Outer(inner=Inner(w=jnp.ones((2, 2))), more=[Inner(w=jnp.ones((3, 1)))]))


def test_check_types_batched_descends() -> None:
    """With batch_ndim, nested structs are checked on one element of the batch too."""
    bad = Outer(inner=Inner(w=jnp.ones((2, 3))), more=[])
    batch = jax.tree.map(lambda x: jnp.stack([x] * 4), bad)
    with pytest.raises(js.ValidationError, match=r"Inner\.w"):
        js.check_types(batch, batch_ndim=1)


class Typed(js.Struct, typecheck=True):
    shape: tuple[int, ...] = js.field(static=True)
    names: dict[str, int] = js.field(default_factory=dict)


def test_type_checks_leave_the_random_module_alone() -> None:
    """beartype samples containers with the random module: its state is put back."""
    random.seed(0)
    expected = [random.random() for _ in range(3)]
    random.seed(0)
    got = []
    for i in range(3):
        Typed(shape=(1, 2, 3), names={"a": i})
        got.append(random.random())
    assert got == expected
