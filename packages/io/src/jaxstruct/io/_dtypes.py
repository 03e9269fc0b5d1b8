"""Naming array dtypes in a manifest, and turning those names back into dtypes safely.

Built-in NumPy dtypes are named by their ``dtype.str`` (``'<f4'``, ``'>i8'``,
``'|b1'``), which keeps byte order. The extension dtypes JAX uses (bfloat16,
the float8/float4/float6 families, int4, int2 ...) come from ``ml_dtypes`` and
have no stable ``.npy`` description (NumPy writes them as opaque ``'<V2'``), so
they are named by their ``ml_dtypes`` name and stored on disk as unsigned
integers of the same width, which ``numpy.load`` reads without help.
"""

from __future__ import annotations

import re

import numpy as np
from jaxstruct.registry import SerializationError

__all__ = ["dtype_name", "parse_dtype", "storage_dtype"]

# Only names listed here are ever looked up on the ml_dtypes module.
_ML_NAMES = frozenset(
    {
        "bfloat16",
        "float4_e2m1fn",
        "float6_e2m3fn",
        "float6_e3m2fn",
        "float8_e3m4",
        "float8_e4m3",
        "float8_e4m3b11fnuz",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "int1",
        "int2",
        "int4",
        "uint1",
        "uint2",
        "uint4",
    }
)
_NUMPY_STR = re.compile(
    r"^[<>|][biufc][1-9][0-9]?$"
    r"|^[<>|][SUV][0-9]{1,9}$"
    r"|^[<>|][mM]8(\[[0-9]{0,4}[a-zA-Z]{1,2}\])?$"
)


_NAMES: dict[np.dtype, str] = {}  # dtypes already found storable, by their manifest name


def dtype_name(dtype: np.dtype, where: object) -> str:
    """Return the manifest name of ``dtype``, or raise if it cannot be stored exactly.

    Raises:
        SerializationError: object, string (``StringDType``) and structured
            dtypes, which have no exact pickle-free representation.
    """
    found = _NAMES.get(dtype)
    if found is not None:
        return found
    name = _checked_name(dtype, where)
    if len(_NAMES) < 1024:
        _NAMES[dtype] = name
    return name


def _checked_name(dtype: np.dtype, where: object) -> str:
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise SerializationError(
            f"cannot export the array at {where}: dtype {dtype!r} holds Python objects or "
            "fields and has no exact pickle-free form; convert it to a plain numeric, bool, "
            "bytes or str dtype first"
        )
    if dtype.type.__module__.startswith("ml_dtypes"):
        if dtype.name not in _ML_NAMES:
            raise SerializationError(
                f"cannot export the array at {where}: ml_dtypes dtype {dtype.name!r} is not "
                f"supported; supported extension dtypes are {sorted(_ML_NAMES)}"
            )
        return dtype.name
    name = dtype.str
    if not _NUMPY_STR.match(name):
        raise SerializationError(
            f"cannot export the array at {where}: dtype {dtype!r} (kind {dtype.kind!r}) is not "
            "supported; convert it to a numeric, bool, bytes, str or datetime dtype first"
        )
    return name


def parse_dtype(name: object, where: str) -> np.dtype:
    """Return the dtype a manifest names, without evaluating anything the file controls.

    Raises:
        SerializationError: the name is not a string naming a supported dtype.
    """
    if type(name) is str:
        found = _PARSED.get(name)
        if found is not None:
            return found
    dtype = _parsed(name, where)
    if len(_PARSED) < 1024:
        _PARSED[name] = dtype  # pyright: ignore[reportArgumentType]  # only str names get here
    return dtype


_PARSED: dict[str, np.dtype] = {}  # names already parsed, with their dtype


def _parsed(name: object, where: str) -> np.dtype:
    if not isinstance(name, str):
        raise SerializationError(
            f"{where}: expected a dtype name string, got {type(name).__name__}"
        )
    if name in _ML_NAMES:
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes ships with jax
            raise SerializationError(
                f"{where}: dtype {name!r} needs the ml_dtypes package; install it (pip install "
                "ml_dtypes) to load this array"
            ) from None
        scalar = getattr(ml_dtypes, name, None)
        if scalar is None:
            raise SerializationError(
                f"{where}: the installed ml_dtypes has no dtype {name!r}; upgrade ml_dtypes"
            )
        return np.dtype(scalar)
    if not _NUMPY_STR.match(name):
        raise SerializationError(f"{where}: unsupported or malformed dtype name {name!r}")
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError) as err:
        raise SerializationError(f"{where}: invalid dtype name {name!r} ({err})") from None
    if dtype.hasobject or dtype.fields is not None:
        raise SerializationError(f"{where}: dtype {name!r} is not allowed")
    return dtype


def storage_dtype(dtype: np.dtype) -> np.dtype:
    """Return the dtype used inside the ``.npy`` member for an array of ``dtype``."""
    if dtype.type.__module__.startswith("ml_dtypes"):
        return np.dtype(f"<u{dtype.itemsize}")
    return dtype
