"""Readable ``repr`` and :func:`pformat`: array values or summaries, width-aware line breaking.

A small array shows its values, written by its own ``repr`` on one line
(``Array([0., 1., 2.], dtype=float32)``, ``array([1, 2])``). An array with
more elements than the threshold of :func:`set_printoptions` (16 unless set),
an empty one, and every kind of array whose values are not at hand get a
summary that tells them apart at a glance:

==========================  ===============================
value                       summary
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

import re
import reprlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from ._fields import MISSING

__all__ = [
    "DEFAULT_THRESHOLD",
    "REPR_WIDTH",
    "array_text",
    "format_value",
    "get_printoptions",
    "pformat",
    "printoptions",
    "set_printoptions",
    "struct_repr",
    "summarize_array",
]

# repr() breaks lines only past this width; everything shorter stays one line.
REPR_WIDTH = 80

#: Arrays with at most this many elements show their values unless set otherwise
#: (the size up to which jaxstruct.testing writes array values out, too).
DEFAULT_THRESHOLD = 16

# One setting for the whole process, not per thread or context: jax.debug.print
# may format its values on a thread of JAX's runtime, which must see what the
# user set.
_threshold = DEFAULT_THRESHOLD


def get_printoptions() -> dict[str, int]:
    """Return the current display options, as :func:`set_printoptions` takes them.

    Returns:
        A new dict: ``{"threshold": n}``.

    Example:
        >>> import jaxstruct.core as js
        >>> js.get_printoptions()
        {'threshold': 16}
    """
    return {"threshold": _threshold}


def set_printoptions(*, threshold: int | None = None) -> None:
    """Set how ``repr``, ``print``, :func:`pformat` and ``jax.debug.print`` show arrays.

    An array with at most ``threshold`` elements (and at least one) shows its
    values, written by the array's own ``repr`` on one line, so NumPy's print
    options (``precision``, ``suppress``) apply to them; a bigger one shows its
    dtype and shape (``float32[4,3]``). Tracers, abstract values and typed PRNG
    keys always show dtype and shape. The setting holds for the whole process;
    :func:`printoptions` sets it for a ``with`` block.

    Args:
        threshold: the largest number of elements shown by value; ``0`` shows
            every array as dtype and shape. ``None`` leaves it as it is.

    Raises:
        TypeError: if ``threshold`` is not an int.
        ValueError: if ``threshold`` is negative.

    Example:
        >>> import jax.numpy as jnp
        >>> import jaxstruct.core as js
        >>> class Particle(js.Struct):
        ...     x: object
        >>> Particle(jnp.arange(3.0))
        Particle(x=Array([0., 1., 2.], dtype=float32))
        >>> js.set_printoptions(threshold=0)
        >>> Particle(jnp.arange(3.0))
        Particle(x=float32[3])
        >>> js.set_printoptions(threshold=16)  # the default
    """
    global _threshold
    if threshold is None:
        return
    if type(threshold) is not int:
        raise TypeError(
            f"set_printoptions(): threshold expected an int (a number of array elements), "
            f"got {type(threshold).__name__} {threshold!r}"
        )
    if threshold < 0:
        raise ValueError(
            f"set_printoptions(): threshold must be 0 or more elements, got {threshold!r}; "
            "0 shows every array as dtype and shape"
        )
    _threshold = threshold


@contextmanager
def printoptions(*, threshold: int | None = None) -> Iterator[dict[str, int]]:
    """Set display options for a ``with`` block (see :func:`set_printoptions`).

    The options in force before the block come back when it ends, also when it
    raises.

    Args:
        threshold: the largest number of elements shown by value; ``0`` shows
            every array as dtype and shape.

    Yields:
        The options in force inside the block, as :func:`get_printoptions` returns them.

    Raises:
        TypeError: if ``threshold`` is not an int.
        ValueError: if ``threshold`` is negative.

    Example:
        >>> import jax.numpy as jnp
        >>> import jaxstruct.core as js
        >>> class Particle(js.Struct):
        ...     x: object
        >>> with js.printoptions(threshold=2):
        ...     print(Particle(jnp.arange(2.0)), Particle(jnp.arange(3.0)))
        Particle(x=Array([0., 1.], dtype=float32)) Particle(x=float32[3])
    """
    before = _threshold
    set_printoptions(threshold=threshold)
    try:
        yield get_printoptions()
    finally:
        set_printoptions(threshold=before)


def array_text(value: Any) -> str | None:
    """Return what ``repr`` shows for an array-like value, or ``None`` for anything else.

    A concrete NumPy or JAX array of 1 to ``threshold`` elements shows its values
    (its own ``repr`` on one line); anything else array-like, its summary.
    """
    if (
        isinstance(value, np.ndarray)
        or (isinstance(value, jax.Array) and not isinstance(value, Tracer))
    ) and 0 < value.size <= _threshold:
        values = _values(value)
        if values is not None:
            return values
    return summarize_array(value)


# numpy (and jax, which prints through numpy) break a long array over lines
# indented under its first bracket, and jax pads the space before "dtype=" to
# that indent once the last line is long; one line keeps the pformat layout intact.
_LINE_BREAK = re.compile(r"\n\s*|(?<=,)\s{2,}(?=dtype=)")


def _values(value: Any) -> str | None:
    """The one-line ``repr`` of a small concrete array, or ``None`` to summarise it."""
    if not _is_np_dtype(value.dtype):
        return None  # typed PRNG keys: their repr is several lines of key data
    if not getattr(value, "is_fully_addressable", True):
        return None  # other processes hold part of it: reading it would hang or fail
    try:
        text = repr(value)
    except Exception:
        # A deleted or donated jax.Array, or a transfer guard forbidding the
        # copy to the host: the summary still says what it was.
        return None
    return _LINE_BREAK.sub(" ", text)


def summarize_array(value: Any) -> str | None:
    """Return the dtype-and-shape summary of an array-like value, or ``None`` for anything else."""
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
    summary = array_text(value)
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
    comma. A small array shows its values (``Array([0., 1.], dtype=float32)``);
    one with more elements than :func:`set_printoptions`' ``threshold`` (16
    unless set) prints as a summary: ``float32[4,3]`` for a JAX array,
    ``np.float32[4,3]`` for a NumPy array. A tracer always prints as
    ``Traced<float32[4,3]>`` and an abstract value as
    ``ShapeDtypeStruct<float32[4,3]>``. Fields declared with ``repr=False`` are
    left out, as in ``repr``.

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
        >>> layer = Linear(jnp.zeros((30, 2)), np.zeros(2))
        >>> print(js.pformat(layer))
        Linear(w=float32[30,2], b=array([0., 0.]), name='linear')
        >>> print(js.pformat(layer, width=30))
        Linear(
            w=float32[30,2],
            b=array([0., 0.]),
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
    """Format a value on one line, arrays as ``repr`` shows them (values or summaries)."""
    return _flat(_doc(value, set()))


@reprlib.recursive_repr()
def struct_repr(self: Any) -> str:
    """``repr`` of a struct: one line when it fits :data:`REPR_WIDTH`, broken otherwise."""
    return pformat(self)
