"""Equality and hashing that work with array fields and never raise under ``jit``."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.core import Tracer

__all__ = ["hash_fields", "values_equal"]


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray | jax.Array)


def _arrays_equal(a: Any, b: Any) -> bool:
    if isinstance(a, Tracer) or isinstance(b, Tracer):
        # Values are unknown while tracing; only the very same tracer is equal.
        return a is b
    if not (_is_array(a) and _is_array(b)):
        return False
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
