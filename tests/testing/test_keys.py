"""Typed PRNG keys: drawn by structs(), compared by the assertions and first_difference."""

import jax
import jax.numpy as jnp
import jaxstruct.core as js
from hypothesis import given, settings
from jaxstruct.testing import assert_pytree_roundtrip, assert_roundtrip, first_difference, structs
from jaxtyping import Array, Float, Key, PRNGKeyArray


class Sampler(js.Struct):
    key: Key[Array, ""]  # noqa: F722
    keys: Key[Array, " n"]  # noqa: F722
    raw: PRNGKeyArray
    rbg: jax.Array = jax.random.key(0, impl="rbg")
    w: Float[Array, " n"] = jnp.zeros(2)  # noqa: F722


def _is_key(x: object) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


@settings(max_examples=15)
@given(structs(Sampler))
def test_key_fields_get_typed_keys(s: Sampler) -> None:
    """Key annotations, PRNGKeyArray and a key default draw typed keys jax.random accepts."""
    assert _is_key(s.key) and s.key.shape == ()
    assert _is_key(s.keys) and s.keys.ndim == 1
    assert _is_key(s.raw) and _is_key(s.rbg)
    assert s.rbg.dtype == jax.random.key(0, impl="rbg").dtype
    jax.random.split(s.key)
    jax.random.normal(s.raw)


def test_assertions_compare_typed_keys() -> None:
    """assert_roundtrip and assert_pytree_roundtrip accept a struct holding typed keys."""
    s = Sampler(
        key=jax.random.key(1),
        keys=jax.random.split(jax.random.key(2), 2),
        raw=jax.random.key(3),
    )
    assert_pytree_roundtrip(s)
    assert_roundtrip(s)


def test_first_difference_names_key_differences() -> None:
    """first_difference reports a different key's data or implementation at its path."""
    a = {"k": jax.random.key(0)}
    assert first_difference(a, {"k": jax.random.key(0)}) is None
    assert "x['k'] (key data): bits differ" in str(first_difference(a, {"k": jax.random.key(1)}))
    found = first_difference(a, {"k": jax.random.key(0, impl="rbg")})
    assert found == "x['k']: PRNG key implementation key<fry> != key<rbg>"
    assert "type" in str(first_difference(a, {"k": jnp.zeros((), jnp.uint32)}))


def test_first_difference_finds_a_changed_key_in_a_struct() -> None:
    """A struct whose key changed differs at the key field's path."""
    s = Sampler(
        key=jax.random.key(1), keys=jax.random.split(jax.random.key(2), 2), raw=jax.random.key(3)
    )
    found = first_difference(s, s.replace(key=jax.random.key(9)))
    assert str(found).startswith("x.key (key data): bits differ")
