"""Readable ``repr`` and :func:`pformat`: array summaries and width-aware line breaking.

Arrays never print their contents; each kind gets a summary that tells it
apart at a glance:

==========================  ===============================
value                       shown as
==========================  ===============================
``jax.Array``               ``float32[4,3]``
``numpy.ndarray``           ``np.float32[4,3]``
tracer (inside ``jit``)     ``Traced<float32[4,3]>``
``jax.ShapeDtypeStruct``    ``ShapeDtypeStruct<float32[4,3]>``
other array-likes           ``TypeName<float32[4,3]>``
==========================  ===============================

Layout is Wadler-style: a value is a document of groups (a struct, list,
tuple or dict) and atoms (everything else). A group is printed on one line
when it fits in the remaining width, counting the comma that follows it;
otherwise its opener ends the line, each item goes on its own line one
indentation step deeper with a trailing comma, and the closer goes on a line
of its own. Deciding group by group from the outside in gives the layout
with the fewest broken groups.
"""

from __future__ import annotations

import reprlib
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from ._fields import MISSING

__all__ = ["REPR_WIDTH", "format_value", "pformat", "struct_repr", "summarize_array"]

# repr() breaks lines only past this width; everything shorter stays one line.
REPR_WIDTH = 80


def summarize_array(value: Any) -> str | None:
    """Return the summary of an array-like value, or ``None`` for anything else."""
    if isinstance(value, np.ndarray):
        return "np." + _dtype_shape(value)
    if isinstance(value, Tracer):
        return f"Traced<{_dtype_shape(value)}>"
    if isinstance(value, jax.Array):
        return _dtype_shape(value)
    if isinstance(value, jax.ShapeDtypeStruct):
        return f"ShapeDtypeStruct<{_dtype_shape(value)}>"
    if _looks_like_array(value):
        return f"{type(value).__name__}<{_dtype_shape(value)}>"
    return None


def _dtype_shape(value: Any) -> str:
    dtype = value.dtype
    name = np.dtype(dtype).name if _is_np_dtype(dtype) else str(dtype)
    return f"{name}[{','.join(str(d) for d in value.shape)}]"


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


class _Group:
    """A breakable document: ``opener item, item closer`` with prefixed items."""

    __slots__ = ("closer", "flat", "items", "opener")

    def __init__(self, opener: str, items: list[tuple[str, Any]], closer: str, flat: str) -> None:
        self.opener = opener
        self.items = items
        self.closer = closer
        self.flat = flat


def is_plain_struct(value: Any) -> bool:
    """Whether ``value`` is a struct printed by our repr (not a user-written one)."""
    return getattr(type(value), "__struct_layout__", None) is not None and getattr(
        type(value).__repr__, "_jaxstruct_repr", False
    )


def _doc(value: Any, path: set[int]) -> str | _Group:
    """Build the document of ``value``; ``path`` holds ids of the enclosing groups."""
    summary = summarize_array(value)
    if summary is not None:
        return summary
    kind = type(value)
    if is_plain_struct(value):
        name = kind.__name__
        if id(value) in path:
            return f"{name}(...)"
        names = kind.__struct_layout__.repr_names  # type: ignore[attr-defined]
        if not names:
            return f"{name}()"
        path.add(id(value))
        items = [(f"{n}=", _doc(getattr(value, n, MISSING), path)) for n in names]
        path.discard(id(value))
        return _group(f"{name}(", items, ")")
    if kind is list or kind is tuple or kind is dict:
        opener, closer = {list: "[]", tuple: "()", dict: "{}"}[kind]
        if not value:
            return opener + closer
        if id(value) in path:
            return f"{opener}...{closer}"
        path.add(id(value))
        if kind is dict:
            items = [(f"{k!r}: ", _doc(v, path)) for k, v in value.items()]
        else:
            items = [("", _doc(v, path)) for v in value]
        path.discard(id(value))
        group = _group(opener, items, closer)
        if kind is tuple and len(value) == 1:
            group.flat = group.flat[:-1] + ",)"
        return group
    if isinstance(value, tuple) and is_namedtuple(kind):
        # Optimizer states (optax) are named tuples of arrays: summarise those too.
        if id(value) in path:
            return f"{kind.__name__}(...)"
        path.add(id(value))
        items = [(f"{n}=", _doc(v, path)) for n, v in zip(kind._fields, value, strict=True)]  # type: ignore[attr-defined]
        path.discard(id(value))
        return _group(f"{kind.__name__}(", items, ")") if items else f"{kind.__name__}()"
    return repr(value)


def is_namedtuple(kind: type) -> bool:
    """Whether ``kind`` is a named tuple class that kept the generated ``__repr__``."""
    return (
        isinstance(getattr(kind, "_fields", None), tuple)
        and getattr(kind.__repr__, "__module__", None) == "collections"
    )


def _group(opener: str, items: list[tuple[str, Any]], closer: str) -> _Group:
    inner = ", ".join(p + (d if type(d) is str else d.flat) for p, d in items)
    return _Group(opener, items, closer, opener + inner + closer)


def _flat(doc: str | _Group) -> str:
    return doc if type(doc) is str else doc.flat  # type: ignore[union-attr]


class _Printer:
    """Lays documents out in ``width`` columns, ``step`` more per nesting level."""

    __slots__ = ("out", "step", "width")

    def __init__(self, width: int, step: int) -> None:
        self.width = width
        self.step = step
        self.out: list[str] = []

    def emit(self, doc: str | _Group, level: int, col: int, trail: int) -> None:
        """Append ``doc`` starting at column ``col``; ``trail`` columns must follow it."""
        out = self.out
        if type(doc) is str:
            out.append(doc)
            return
        group: _Group = doc  # type: ignore[assignment]
        if col + len(group.flat) + trail <= self.width:
            out.append(group.flat)
            return
        out.append(group.opener)
        inner = level + self.step
        pad = "\n" + " " * inner
        for prefix, child in group.items:
            out.append(pad + prefix)
            # In a broken group every item is followed by "," and a line break.
            self.emit(child, inner, inner + len(prefix), 1)
            out.append(",")
        out.append("\n" + " " * level + group.closer)


def pformat(obj: Any, *, width: int = REPR_WIDTH, indent: int = 4) -> str:
    """Return a readable, width-aware text form of ``obj``.

    Structs (those using the library's repr), lists, tuples, named tuples and dicts are
    laid out on one line when they fit in ``width`` columns; otherwise they
    break, one item per line, ``indent`` columns deeper, each followed by a
    comma. Arrays print as summaries: ``float32[4,3]`` for a JAX array,
    ``np.float32[4,3]`` for a NumPy array, ``Traced<float32[4,3]>`` for a
    tracer and ``ShapeDtypeStruct<float32[4,3]>`` for an abstract value.
    Fields declared with ``repr=False`` are left out, as in ``repr``.

    Args:
        obj: the value to format (a struct or any other value).
        width: the number of columns to fit lines in.
        indent: the number of columns each nesting level adds.

    Returns:
        The formatted text, without a trailing newline.

    Raises:
        ValueError: if ``width`` is not positive or ``indent`` is negative.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> import jaxstruct.core as js
        >>> class Linear(js.Struct):
        ...     w: object
        ...     b: object
        ...     name: str = js.field(static=True, default="linear")
        >>> layer = Linear(jnp.zeros((3, 2)), np.zeros(2))
        >>> print(js.pformat(layer))
        Linear(w=float32[3,2], b=np.float64[2], name='linear')
        >>> print(js.pformat(layer, width=30))
        Linear(
            w=float32[3,2],
            b=np.float64[2],
            name='linear',
        )
    """
    if width <= 0:
        raise ValueError(f"pformat(): width must be a positive number of columns, got {width!r}")
    if indent < 0:
        raise ValueError(f"pformat(): indent must be 0 or more columns, got {indent!r}")
    printer = _Printer(width, indent)
    printer.emit(_doc(obj, set()), 0, 0, 0)
    return "".join(printer.out)


def format_value(value: Any) -> str:
    """Format a value on one line; arrays and tracers become summaries."""
    return _flat(_doc(value, set()))


@reprlib.recursive_repr()
def struct_repr(self: Any) -> str:
    """``repr`` of a struct: one line when it fits :data:`REPR_WIDTH`, broken otherwise."""
    return pformat(self)
