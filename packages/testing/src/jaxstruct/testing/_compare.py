"""Find the first difference between two values, leaf by leaf, dtype and bits included."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from typing import Any

import jaxstruct.core as js
import numpy as np
from jaxstruct.core import FieldSpec

from ._arrays import is_key_array

__all__ = ["difference", "every_field", "first_difference", "serialized"]


def _is_array(value: Any) -> bool:
    if isinstance(value, np.ndarray | np.generic):
        return True
    import jax

    return isinstance(value, jax.Array)


def _key_difference(a: Any, b: Any, path: str) -> str | None:
    """Typed PRNG keys: NumPy cannot hold them, so compare implementation and key data."""
    import jax

    if not (is_key_array(a) and is_key_array(b)):
        return f"{path}: dtype {a.dtype} != {b.dtype}"
    if a.dtype != b.dtype:  # a key dtype names its implementation (key<fry>, key<rbg>)
        return f"{path}: PRNG key implementation {a.dtype} != {b.dtype}"
    if a.shape != b.shape:
        return f"{path}: shape {a.shape} != {b.shape}"
    found = _array_difference(jax.random.key_data(a), jax.random.key_data(b), path)
    return None if found is None else found.replace(f"{path}:", f"{path} (key data):", 1)


def _array_difference(a: Any, b: Any, path: str) -> str | None:
    if is_key_array(a) or is_key_array(b):
        return _key_difference(a, b, path)
    x, y = np.asarray(a), np.asarray(b)
    if x.dtype != y.dtype:
        return f"{path}: dtype {x.dtype} != {y.dtype}"
    if x.shape != y.shape:
        return f"{path}: shape {x.shape} != {y.shape}"
    if x.tobytes() == y.tobytes():
        return None
    width = x.dtype.itemsize
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    for i in range(flat_x.size):
        if flat_x[i : i + 1].tobytes() != flat_y[i : i + 1].tobytes():
            index = np.unravel_index(i, x.shape) if x.shape else ()
            return (
                f"{path}: bits differ at index {tuple(int(j) for j in index)}: "
                f"{flat_x[i]!r} != {flat_y[i]!r} (dtype {x.dtype}, {width} bytes each)"
            )
    return f"{path}: bits differ"  # pragma: no cover - tobytes differed somewhere


def _float_bits(value: float | complex) -> bytes:
    if isinstance(value, complex):
        return struct.pack("<dd", value.real, value.imag)
    return struct.pack("<d", value)


def first_difference(
    expected: Any, actual: Any, path: str = "x", *, serialized_only: bool = False
) -> str | None:
    """Return a description of the first difference between two values, or ``None``.

    Types must match exactly (a NumPy array is not a JAX array), arrays must
    agree in dtype, shape and bits, floats bit for bit (so ``-0.0 != 0.0`` and
    ``nan == nan``); typed PRNG keys (``jax.random.key``) in implementation,
    shape and key data. Structs are compared field by field, every field
    (``compare=False`` and opaque ones included).

    Args:
        expected: the original value.
        actual: the value to compare with it.
        path: how to name ``expected`` in the description.
        serialized_only: skip the fields exports do not store (opaque fields by
            default, any field declared ``serialize=False``); derived fields
            are still compared, since loading recomputes them. This is what
            ``assert_roundtrip`` compares.

    Returns:
        ``None`` when the values agree, else ``"<path>: <what differs>"``.

    Example:
        >>> import numpy as np
        >>> from jaxstruct.testing import first_difference
        >>> a, b = {"a": np.zeros(2)}, {"a": np.array([0.0, 1.0])}
        >>> print(first_difference(a, b))  # doctest: +ELLIPSIS
        x['a']: bits differ at index (1,): ... (dtype float64, 8 bytes each)
        >>> print(first_difference({"w": 0.0}, {"w": -0.0}))
        x['w']: 0.0 != -0.0
    """
    return difference(expected, actual, path, serialized if serialized_only else every_field)


def every_field(spec: FieldSpec) -> bool:
    """Compare every field."""
    return True


def serialized(spec: FieldSpec) -> bool:
    """Compare the fields an export stores, and derived ones (recomputed on load)."""
    return spec.should_serialize or spec.is_derived


def difference(
    expected: Any, actual: Any, path: str, keep: Callable[[FieldSpec], bool]
) -> str | None:
    """:func:`first_difference`, comparing the struct fields ``keep`` accepts."""
    if expected is actual:
        return None
    if type(expected) is not type(actual):
        return (
            f"{path}: type {type(expected).__module__}.{type(expected).__qualname__} != "
            f"{type(actual).__module__}.{type(actual).__qualname__}"
        )
    if _is_array(expected):
        return _array_difference(expected, actual, path)
    if js.is_struct(expected):
        for name, spec in js.fields(expected).items():
            if not keep(spec):
                continue
            found = difference(
                getattr(expected, name, js.MISSING),
                getattr(actual, name, js.MISSING),
                f"{path}.{name}",
                keep,
            )
            if found:
                return found
        return None
    if isinstance(expected, float | complex):
        if _float_bits(expected) != _float_bits(actual):
            both_nan = isinstance(expected, float) and math.isnan(expected) and math.isnan(actual)
            if not both_nan:
                return f"{path}: {expected!r} != {actual!r}"
        return None
    if isinstance(expected, tuple | list):
        if len(expected) != len(actual):
            return f"{path}: length {len(expected)} != {len(actual)}"
        for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
            found = difference(a, b, f"{path}[{i}]", keep)
            if found:
                return found
        return None
    if isinstance(expected, Mapping):
        # Key order is not compared: JAX rebuilds dicts with sorted keys.
        missing = [k for k in expected if k not in actual]
        extra = [k for k in actual if k not in expected]
        if missing or extra:
            return f"{path}: keys differ, missing {missing!r}, unexpected {extra!r}"
        for key in expected:
            found = difference(expected[key], actual[key], f"{path}[{key!r}]", keep)
            if found:
                return found
        return None
    try:
        equal = bool(expected == actual)
    except Exception as err:
        return f"{path}: {expected!r} and {actual!r} cannot be compared ({err})"
    return None if equal else f"{path}: {expected!r} != {actual!r}"
