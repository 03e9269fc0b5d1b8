"""Values of small arrays in the failing example Hypothesis prints.

A struct's own repr shows array values only up to the threshold of
``jaxstruct.core.set_printoptions`` (``Counter(count=int32[])`` once it is 0)
and never a typed key's data, the right thing in logs but not in a failing
example, where the value is the point. ``structs()`` adds a note to each
instance it draws (not the nested ones, which their parent's note shows):
Hypothesis prints it under the failing example, with arrays of up to
:data:`SMALL` elements shown by value.
The text is only built when Hypothesis prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jaxstruct.core as js
import numpy as np

from ._arrays import is_key_array

__all__ = ["SMALL", "Shown", "show"]

#: Arrays with at most this many elements are shown by value.
SMALL = 16


def _array(value: Any) -> str | None:
    if is_key_array(value):
        import jax

        data = np.asarray(jax.random.key_data(value))
        return f"{value.dtype}{list(value.shape)}(key data {data.tolist()})"
    if isinstance(value, np.ndarray | np.generic):
        kind = "np"
    else:
        import jax
        from jax.core import Tracer

        if not isinstance(value, jax.Array) or isinstance(value, Tracer):
            return None
        kind = "jnp"
    array = np.asarray(value)
    name = array.dtype.name
    if array.size > SMALL:
        return f"{kind}.{name}{list(array.shape)} (too big to show)"
    if isinstance(value, np.generic):
        return repr(value)
    return f"{kind}.asarray({array.tolist()!r}, dtype={name})"


def show(value: Any) -> str:
    """Write ``value`` with the contents of small arrays, structs field by field.

    Example:
        >>> import numpy as np
        >>> show({"w": np.array([1.5, 2.0], np.float32)})
        "{'w': np.asarray([1.5, 2.0], dtype=float32)}"
    """
    text = _array(value)
    if text is not None:
        return text
    if js.is_struct(value):
        parts = [
            f"{name}={show(getattr(value, name, js.MISSING))}"
            for name, spec in js.fields(value).items()
            if spec.repr
        ]
        return f"{type(value).__qualname__}({', '.join(parts)})"
    if isinstance(value, list):
        return f"[{', '.join(map(show, value))}]"
    if isinstance(value, tuple) and type(value) is tuple:
        inner = ", ".join(map(show, value))
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, Mapping) and type(value) is dict:
        return "{" + ", ".join(f"{k!r}: {show(v)}" for k, v in value.items()) + "}"
    return repr(value)


class Shown:
    """A note on a drawn instance, written out only when Hypothesis prints it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"structs() drew, with small arrays shown by value: {show(self.value)}"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))
