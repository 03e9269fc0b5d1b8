"""Readable ``repr`` that summarises arrays as ``float32[4,3]``."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["format_value"]


def format_value(value: Any) -> str:
    """Format a field value; arrays and tracers become ``dtype[shape]``."""
    if _looks_like_array(value):
        shape = ",".join(str(d) for d in value.shape)
        return (
            f"{np.dtype(value.dtype).name if _is_np_dtype(value.dtype) else value.dtype}[{shape}]"
        )
    kind = type(value)
    if kind is list:
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if kind is tuple:
        inner = ", ".join(format_value(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if kind is dict:
        return "{" + ", ".join(f"{k!r}: {format_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _is_np_dtype(dtype: Any) -> bool:
    try:
        np.dtype(dtype)
    except TypeError:
        return False
    return True


def _looks_like_array(value: Any) -> bool:
    if isinstance(value, np.generic | type):
        return False
    return (
        hasattr(value, "shape")
        and hasattr(value, "dtype")
        and isinstance(getattr(value, "shape", None), tuple)
    )
