"""Equality and hashing that work with array fields and never raise under ``jit``."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from ._errors import TracedComparisonError

__all__ = [
    "TracedLeaf",
    "hash_fields",
    "is_key_array",
    "traced_comparison_message",
    "tree_equal",
    "values_equal",
]


class TracedLeaf(Exception):
    """Internal: ``values_equal`` met a traced array whose value is not known yet."""


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray | jax.Array)


def is_key_array(x: Any) -> bool:
    """Whether ``x`` is an array of typed PRNG keys (``jax.random.key``): NumPy cannot hold it."""
    return isinstance(x, jax.Array) and jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key)


def _keys_equal(a: Any, b: Any) -> bool:
    # Typed keys are equal when they have the same implementation and key data.
    if not (is_key_array(a) and is_key_array(b)) or a.shape != b.shape:
        return False
    if a.dtype != b.dtype:  # a key dtype names its implementation (key<fry>, key<rbg>)
        return False
    return bool(np.array_equal(jax.random.key_data(a), jax.random.key_data(b)))


def _arrays_equal(a: Any, b: Any) -> bool:
    if isinstance(a, Tracer) or isinstance(b, Tracer):
        # Values are unknown while tracing: only the very same tracer is known
        # to be equal; answering False for the others would be silently wrong.
        if a is b:
            return True
        if not (_is_array(a) and _is_array(b)) or a.shape != b.shape or a.dtype != b.dtype:
            return False  # known while tracing: shapes and dtypes are static
        raise TracedLeaf
    if not (_is_array(a) and _is_array(b)):
        return False
    if is_key_array(a) or is_key_array(b):
        return _keys_equal(a, b)
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    try:
        return bool(np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"))
    except TypeError:
        # Extension dtypes (bfloat16, float8, int4) without NaN support in array_equal.
        return x.tobytes() == y.tobytes()


def _leaf_equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if _is_array(a) or _is_array(b):
        return _arrays_equal(a, b)
    try:
        result = a == b
    except (TracedLeaf, TracedComparisonError):
        raise  # a nested struct holding traced arrays: no silent False
    except Exception:
        return False
    if result is True or result is False:
        return result
    try:
        return bool(result)
    except Exception:
        return False


def _is_struct(x: Any) -> bool:
    return hasattr(type(x), "__struct_layout__")


def values_equal(a: Any, b: Any) -> bool:
    """Compare two field values: pytree structure, then leaf by leaf (arrays by value)."""
    if a is b:
        return True
    if _is_array(a) or _is_array(b):
        return _arrays_equal(a, b)
    # Nested structs are compared by their own __eq__, so their compare=False
    # fields (and opaque fields, carried by identity in the aux data) are ignored.
    leaves_a, tree_a = jax.tree_util.tree_flatten(a, is_leaf=_is_struct)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b, is_leaf=_is_struct)
    if tree_a.num_leaves == 1 and tree_a.num_nodes == 1:
        # A plain leaf (a number, a string, an unregistered object).
        return tree_b.num_nodes == 1 and tree_b.num_leaves == 1 and _leaf_equal(a, b)
    try:
        if tree_a != tree_b:
            return False
    except Exception:
        return False
    return all(_leaf_equal(x, y) for x, y in zip(leaves_a, leaves_b, strict=True))


def traced_comparison_message(cls: type, name: str) -> str:
    """The error for ``==`` on structs whose field ``name`` holds traced arrays."""
    return (
        f"{cls.__qualname__} == {cls.__qualname__}: field {name!r} holds arrays traced by "
        "jit, vmap or grad, whose values are not known while tracing, so == cannot answer "
        "True or False. Use jaxstruct.core.tree_equal(a, b), which returns a traced boolean "
        "array, or compare outside the transformation"
    )


def tree_equal(a: Any, b: Any) -> bool | jax.Array:
    """Compare two pytrees leaf by leaf; a traced boolean when leaves are traced.

    The trees must have the same structure (static fields included) and each
    pair of leaves the same shape, dtype and values (NaN equal to NaN), or the
    answer is ``False``. Outside ``jit`` it is a Python ``bool``; under
    ``jit``, ``vmap`` or ``grad``, when some leaf is traced, it is a boolean
    scalar array (use it with ``jnp.where`` or ``lax.cond``). Unlike ``==``,
    every leaf counts, ``compare=False`` fields included.

    Args:
        a: a pytree (structs, lists, dicts, arrays, ...).
        b: another pytree.

    Returns:
        ``True``/``False``, or a traced boolean scalar.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import jaxstruct.core as js
        >>> class P(js.Struct):
        ...     w: jax.Array
        >>> js.tree_equal(P(w=jnp.ones(2)), P(w=jnp.ones(2)))
        True
        >>> jax.jit(js.tree_equal)(P(w=jnp.ones(2)), P(w=jnp.zeros(2)))
        Array(False, dtype=bool)
    """
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    try:
        if tree_a != tree_b:
            return False
    except Exception:
        return False
    traced: list[Any] = []
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if isinstance(x, Tracer) or isinstance(y, Tracer):
            if x is y:
                continue
            if not (_is_array(x) and _is_array(y)):
                return False
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            import jax.numpy as jnp

            if is_key_array(x):
                # Same dtype, so the same implementation: compare the key data.
                traced.append(jnp.array_equal(jax.random.key_data(x), jax.random.key_data(y)))
            else:
                nan = jnp.issubdtype(x.dtype, jnp.inexact)
                traced.append(jnp.array_equal(x, y, equal_nan=nan))
        elif not (_arrays_equal(x, y) if _is_array(x) or _is_array(y) else _leaf_equal(x, y)):
            return False
    if not traced:
        return True
    import jax.numpy as jnp

    return jnp.all(jnp.stack(traced))


def hash_fields(obj: Any, names: tuple[str, ...]) -> int:
    """Hash ``obj`` by type and field values; ``TypeError`` names an unhashable field."""
    values = tuple(getattr(obj, n) for n in names)
    try:
        return hash((type(obj), values))
    except TypeError:
        pass
    for name, value in zip(names, values, strict=True):
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                f"{type(obj).__qualname__} instance is unhashable because field {name!r} holds "
                f"an unhashable {type(value).__name__}; hash() works when every compared field "
                "is hashable (use tuples instead of lists, or field(compare=False) to leave "
                "the field out)"
            ) from None
    raise TypeError(f"{type(obj).__qualname__} instance is unhashable")  # pragma: no cover
