"""The ``sizes=`` and ``dtypes=`` options of ``structs()`` and ``arrays()``.

Named sizes used to be drawn from 0..3, with 0 so likely that most draws of a
struct with two or three arrays held an empty one; and every example had a new
shape and dtype, so code under ``jax.jit`` compiled again for nearly every
example. The options say which sizes and dtypes to draw: a fixed size or a few
(``sizes=(2, 5)``, a handful of compilations reused across examples), a range,
any strategy of ints, or per name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st

__all__ = ["DEFAULT_SIZES", "DrawOptions", "dtype_names", "size_strategy"]

# 1, 2 or 3, and 0 (an empty array) one draw in ten. sampled_from picks evenly,
# where st.integers(0, n) favours 0 (a quarter of its draws): most draws of a
# struct with a few arrays then held an empty one. Sorted, so that the shrinker,
# which lowers the index, lowers the size with it: 3 -> 2 -> 1, never 3 -> 1 ->
# 3 (each size it tries is a new shape, and jitted code compiles again).
DEFAULT_SIZES: st.SearchStrategy[int] = st.sampled_from((1, 1, 1, 2, 2, 2, 3, 3, 3, 0))


def size_strategy(spec: Any, what: str) -> st.SearchStrategy[int]:
    """A strategy of sizes from an option: an int, a range, a few ints, or a strategy.

    Example:
        >>> size_strategy(3, "sizes")
        just(3)
        >>> size_strategy(range(1, 5), "sizes")
        integers(min_value=1, max_value=4)
        >>> size_strategy((2, 4), "sizes")
        sampled_from([2, 4])
    """
    if spec is None:
        return DEFAULT_SIZES
    if isinstance(spec, st.SearchStrategy):
        return spec
    if isinstance(spec, bool):
        raise TypeError(f"{what}: expected a size, got {spec!r}")
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"{what}: a size cannot be negative, got {spec}")
        return st.just(spec)
    if isinstance(spec, range):
        if spec.step != 1 or len(spec) == 0 or spec.start < 0:
            raise ValueError(f"{what}: expected a non-empty range(lo, hi) of sizes, got {spec!r}")
        return st.integers(spec.start, spec.stop - 1)
    few = isinstance(spec, Sequence) and not isinstance(spec, str) and spec
    if few and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in spec):
        return st.sampled_from(list(spec))
    raise TypeError(
        f"{what}: expected a size (int), a range, a few sizes (a tuple of ints) or a strategy "
        f"of ints, got {spec!r}"
    )


def dtype_names(dtypes: Any) -> tuple[str, ...] | None:
    """Normalise a ``dtypes=`` option (names, NumPy dtypes or types) to dtype names.

    Example:
        >>> import numpy as np
        >>> dtype_names(["float32", np.int8, np.dtype("bool")])
        ('float32', 'int8', 'bool')
    """
    if dtypes is None:
        return None
    if isinstance(dtypes, str | np.dtype | type):
        dtypes = (dtypes,)
    names: list[str] = []
    for item in dtypes:
        if isinstance(item, str) and item == "bfloat16":
            names.append(item)
            continue
        try:
            names.append(np.dtype(item).name)
        except TypeError:
            raise TypeError(f"dtypes: {item!r} is not a dtype") from None
    if not names:
        raise ValueError("dtypes: expected at least one dtype")
    return tuple(names)


class DrawOptions:
    """Resolved ``sizes=`` and ``dtypes=`` options (see :func:`structs`)."""

    __slots__ = ("default_size", "dtypes", "named_sizes")

    def __init__(self, sizes: Any = None, dtypes: Any = None) -> None:
        self.named_sizes: dict[str, st.SearchStrategy[int]] = {}
        if isinstance(sizes, Mapping):
            self.default_size = DEFAULT_SIZES
            for name, spec in sizes.items():
                self.named_sizes[name] = size_strategy(spec, f"sizes[{name!r}]")
        else:
            self.default_size = size_strategy(sizes, "sizes")
        self.dtypes = dtype_names(dtypes)

    def size(self, name: str | None) -> st.SearchStrategy[int]:
        """The strategy of the named size ``name`` (``None``: a size with no name)."""
        if name is None:
            return self.default_size
        return self.named_sizes.get(name, self.default_size)

    def pick_dtypes(self, allowed: tuple[str, ...]) -> tuple[str, ...]:
        """The dtypes to draw among ``allowed``: those the option names, when any are allowed."""
        if self.dtypes is None:
            return allowed
        kept = tuple(d for d in self.dtypes if d in allowed)
        return kept or allowed


DEFAULT_OPTIONS = DrawOptions()
