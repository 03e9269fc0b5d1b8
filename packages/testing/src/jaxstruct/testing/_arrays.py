"""Array strategies: NumPy or JAX arrays, shapes and dtypes read from annotations.

jaxtyping annotations (``Float[Array, "n 3"]``) are understood when jaxtyping
is installed: the dtype family, fixed sizes, and named sizes that agree across
the fields of one instance (so a runtime type checker accepts the draw).
"""

from __future__ import annotations

import contextvars
import functools
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ._checks import NOTHING, Checks
from ._options import DEFAULT_OPTIONS, DrawOptions
from ._refusals import record_field_refusal
from ._satisfy import array_strategy, feasible_dtypes, floats_of_width, values_for

__all__ = [
    "CURRENT_SIZES",
    "DEFAULT_DTYPES",
    "LIVE",
    "ArrayRequest",
    "SizeTable",
    "array_request",
    "arrays",
    "arrays_for",
    "bind_sizes",
    "fixed_dim",
    "floats_of_width",
    "is_array_annotation",
    "is_key_array",
    "jax_dtypes_ok",
    "key_impl_of",
    "key_request",
    "merge_requests",
    "numpy_scalars",
    "options_of",
    "resolve_sizes",
]

# Dtypes drawn when an annotation does not pin one. bfloat16 is made by viewing
# uint16 bits (Hypothesis cannot draw ml_dtypes directly), which also exercises
# bit-exact round trips of an extension dtype.
DEFAULT_DTYPES = (
    "bool",
    "int8",
    "int32",
    "int64",
    "uint8",
    "float16",
    "float32",
    "float64",
    "complex64",
    "bfloat16",
)
_WIDE = frozenset({"int64", "uint64", "float64", "complex128"})


def jax_dtypes_ok(name: str) -> bool:
    """Whether JAX keeps dtype ``name`` as is (64-bit types need ``jax_enable_x64``)."""
    if name not in _WIDE:
        return True
    import jax

    return bool(jax.config.read("jax_enable_x64"))


class ArrayRequest:
    """What an annotation asks for: array kind, candidate dtypes, a shape recipe, value checks."""

    __slots__ = ("checks", "dims", "dtypes", "kind")

    def __init__(
        self,
        kind: str,
        dtypes: tuple[str, ...],
        dims: tuple[Any, ...] | None,
        checks: Checks = NOTHING,
    ) -> None:
        self.kind = kind  # "numpy", "jax", "any", or "key" (typed PRNG keys; dtypes: (impl,))
        self.dtypes = dtypes
        self.dims = dims  # None: any small shape; else jaxtyping dims
        self.checks = checks  # what the values must satisfy (bounds, structure)

    def with_checks(self, checks: Checks) -> ArrayRequest:
        """The same request with ``checks`` added to its own."""
        if checks.empty:
            return self
        return ArrayRequest(self.kind, self.dtypes, self.dims, self.checks.merge(checks))


def _jaxtyping_base() -> Any:
    module = sys.modules.get("jaxtyping")
    if module is None:
        try:
            import jaxtyping as module
        except ImportError:
            return None
    return module.AbstractArray


def _kind_of(array_type: Any) -> str:
    if array_type is np.ndarray:
        return "numpy"
    import jax

    if array_type is jax.Array:
        return "jax"
    return "any"


def is_array_annotation(annotation: Any) -> bool:
    """Whether ``annotation`` is ``np.ndarray``, ``jax.Array`` or a jaxtyping array type."""
    return array_request(annotation) is not None


def array_request(annotation: Any) -> ArrayRequest | None:
    """Read an array annotation, or return ``None`` when it is not one."""
    if annotation is np.ndarray:
        return ArrayRequest("numpy", DEFAULT_DTYPES, None)
    if "jax" in sys.modules:
        import jax

        if annotation is jax.Array:
            return ArrayRequest("jax", DEFAULT_DTYPES, None)
    base = _jaxtyping_base()
    if base is not None and isinstance(annotation, type) and issubclass(annotation, base):
        dtypes = getattr(annotation, "dtypes", None)
        impl = _key_impl_named(dtypes)
        if impl is not None:
            return ArrayRequest("key", (impl,), annotation.dims)
        if not isinstance(dtypes, tuple | list):
            wanted: tuple[str, ...] = DEFAULT_DTYPES  # jaxtyping's "any dtype" (Shaped)
        else:
            wanted = tuple(d for d in dtypes if _drawable(d))
        return ArrayRequest(
            _kind_of(getattr(annotation, "array_type", None)), wanted, annotation.dims
        )
    return None


def _key_impl_named(dtypes: Any) -> str | None:
    """For a typed-key annotation (jaxtyping ``Key``): the implementation it names, or ``""``.

    jaxtyping's ``Key`` lists the dtype ``"prng_key"`` (any implementation); a
    dtype string such as ``"key<rbg>"`` names one (``""`` means JAX's default).
    """
    if not isinstance(dtypes, tuple | list):
        return None
    for name in dtypes:
        if name == "prng_key":
            return ""
        if isinstance(name, str) and name.startswith("key<") and name.endswith(">"):
            return {"fry": "threefry2x32"}.get(name[4:-1], name[4:-1])
    return None


def is_key_array(value: Any) -> bool:
    """Whether ``value`` is a JAX array of typed PRNG keys (``jax.random.key``)."""
    if "jax" not in sys.modules or isinstance(value, np.ndarray | np.generic):
        return False
    import jax

    return isinstance(value, jax.Array) and jax.numpy.issubdtype(value.dtype, jax.dtypes.prng_key)


def key_impl_of(key: Any) -> Any:
    """A typed key array's implementation, as ``jax.random.key(..., impl=)`` takes it."""
    import jax

    return jax.random.key_impl(key)


class _Fixed:
    """A fixed size in the form jaxtyping's dims take (read by :func:`_shape`)."""

    __slots__ = ("broadcastable", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.broadcastable = False


def fixed_dim(size: int) -> Any:
    """A dimension of exactly ``size`` for an :class:`ArrayRequest`'s ``dims``."""
    return _Fixed(size)


def key_request(impl: Any = "", dims: tuple[Any, ...] | None = ()) -> ArrayRequest:
    """A request for typed PRNG keys of implementation ``impl`` (``""``: JAX's default)."""
    return ArrayRequest("key", (impl,), dims)


_DRAWABLE = frozenset(
    {
        "bool",
        *(f"int{n}" for n in (8, 16, 32, 64)),
        *(f"uint{n}" for n in (8, 16, 32, 64)),
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        "bfloat16",
    }
)


def _drawable(name: str) -> bool:
    # float8/int4 extension dtypes have no Hypothesis element strategy; skip them.
    return name in _DRAWABLE


class SizeTable(dict[str, Any]):
    """The named sizes of one drawn instance (name -> size), with the draw's options.

    ``minimums`` holds the least size a name may take (a probability vector's
    axis needs one entry).
    """

    def __init__(self, options: DrawOptions = DEFAULT_OPTIONS) -> None:
        super().__init__()
        self.options = options
        self.minimums: dict[str, int] = {}

    def draw_size(self, name: str, draw: Callable[..., Any], least: int = 0) -> int:
        """Draw the named size ``name`` (at least its minimum and ``least``) and keep it."""
        size = max(draw(self.options.size(name)), self.minimums.get(name, 0), least)
        self[name] = size
        return size


#: The named sizes of the instance ``structs()`` is drawing (nested structs share them).
CURRENT_SIZES: contextvars.ContextVar[SizeTable | None] = contextvars.ContextVar(
    "jaxstruct_testing_sizes", default=None
)


class _Live(dict[str, Any]):
    """Stands for "the size table of the instance being drawn" in a strategy built once.

    ``structs()`` builds each field's strategy once per class and reuses it for
    every draw (building them per draw was most of a draw's cost); the sizes a
    drawn array shares are read when it is drawn.
    """

    def __repr__(self) -> str:
        return "LIVE"


LIVE: dict[str, Any] = _Live()


def resolve_sizes(sizes: dict[str, Any]) -> dict[str, Any]:
    """The table ``sizes`` stands for: the current instance's when it is :data:`LIVE`."""
    if sizes is LIVE:
        found = CURRENT_SIZES.get()
        return found if found is not None else SizeTable()
    return sizes


def options_of(sizes: dict[str, Any]) -> DrawOptions:
    """The options a size table carries (the defaults for a plain dict)."""
    return getattr(sizes, "options", DEFAULT_OPTIONS)


def _shape(
    dims: tuple[Any, ...] | None,
    sizes: dict[str, Any],
    draw: Callable[..., Any],
    structure: str | None = None,
) -> tuple[int, ...] | None:
    """Draw a shape for ``dims``; ``None`` when ``structure`` rules every shape out.

    A square structure (symmetric, positive definite) makes an unbound last
    named size take the size before it; a simplex needs one entry or more.
    """
    options = options_of(sizes)
    side = options.size(None)
    square = structure in ("symmetric", "positive_definite")
    least = 1 if structure == "simplex" else 0
    if dims is None:
        if square:
            n = draw(side)
            return (*draw(st.lists(side, max_size=1)), n, n)
        if structure == "simplex":
            return (*draw(st.lists(side, max_size=1)), max(1, draw(side)))
        return tuple(draw(st.lists(side, max_size=3)))
    shape: list[int] = []
    last = len(dims) - 1
    for index, dim in enumerate(dims):
        kind = type(dim).__name__
        name: Any = getattr(dim, "name", None)
        # The size an unbound last axis takes to make a square matrix.
        twin = shape[-1] if square and index == last and shape else None
        need = least if index == last else 0
        if kind in ("_FixedDim", "_Fixed"):
            size = dim.size
            shape.append(1 if dim.broadcastable and draw(st.booleans()) else size)
        elif kind == "_NamedDim":
            if name not in sizes:
                if twin is not None:
                    sizes[name] = twin
                elif isinstance(sizes, SizeTable):
                    sizes.draw_size(name, draw, need)
                else:
                    sizes[name] = max(draw(options.size(name)), need)
            shape.append(1 if dim.broadcastable and draw(st.booleans()) else sizes[name])
        elif kind in ("_NamedVariadicDim",):
            if name not in sizes:
                sizes[name] = tuple(draw(st.lists(options.size(name), max_size=2)))
            shape.extend(sizes[name])
        elif kind == "_AnonymousVariadicDim":
            shape.extend(draw(st.lists(side, max_size=2)))
        else:
            # "_" (any size) and symbolic sizes ("n+1"): one free size.
            shape.append(twin if twin is not None else max(draw(side), need))
    if square and (len(shape) < 2 or shape[-1] != shape[-2]):
        return None
    if least and (not shape or shape[-1] < least):
        return None
    return tuple(shape)


def structure_fits(dims: tuple[Any, ...] | None, structure: str | None) -> bool:
    """Whether some shape of ``dims`` can hold ``structure`` (square matrices need two axes)."""
    if dims is None or structure is None:
        return True
    kinds = [type(d).__name__ for d in dims]
    if any(k in ("_NamedVariadicDim", "_AnonymousVariadicDim") for k in kinds):
        return True
    need = 2 if structure in ("symmetric", "positive_definite") else 1
    if len(dims) < need:
        return False
    if need == 2:
        a, b = dims[-2], dims[-1]
        fixed = ("_FixedDim", "_Fixed")
        if type(a).__name__ in fixed and type(b).__name__ in fixed and a.size != b.size:
            return False
    last = dims[-1]
    return not (
        structure == "simplex" and type(last).__name__ in ("_FixedDim", "_Fixed") and last.size == 0
    )


def bind_sizes(dims: tuple[Any, ...] | None, shape: tuple[int, ...], sizes: dict[str, Any]) -> None:
    """Record in ``sizes`` the named sizes a given array's ``shape`` shows for ``dims``.

    Names already bound are left alone (the class's own checks judge a
    mismatch); variadic dims take what the fixed ones leave.
    """
    if dims is None:
        return
    kinds = [type(d).__name__ for d in dims]
    variadic = [
        i for i, k in enumerate(kinds) if k in ("_NamedVariadicDim", "_AnonymousVariadicDim")
    ]
    if len(variadic) > 1 or (not variadic and len(dims) != len(shape)):
        return
    if variadic and len(shape) < len(dims) - 1:
        return
    split = variadic[0] if variadic else len(dims)
    tail = len(dims) - split - 1
    pairs = list(zip(dims[:split], shape[:split], strict=True))
    if variadic:
        pairs += list(zip(dims[split + 1 :], shape[len(shape) - tail :], strict=True))
        name: Any = getattr(dims[split], "name", None)
        if kinds[split] == "_NamedVariadicDim" and name not in sizes:
            sizes[name] = tuple(shape[split : len(shape) - tail])
    for dim, size in pairs:
        name = getattr(dim, "name", None)  # a str whenever the dim is named
        named = type(dim).__name__ == "_NamedDim" and name not in sizes
        if named and not (dim.broadcastable and size == 1):
            sizes[name] = size


@functools.lru_cache(maxsize=16)
def _elements(dtype: np.dtype[Any]) -> st.SearchStrategy[Any] | None:
    if dtype.kind == "f":
        # Any bit pattern of the width (NaNs, infinities, subnormals) is fair game.
        return floats_of_width(8 * dtype.itemsize)
    return None


@functools.lru_cache(maxsize=256)
def _one_of(names: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.sampled_from(names)


def _discard(reason: str) -> NoReturn:
    """Throw the draw away: the sizes drawn so far leave no value satisfying the checks."""
    from hypothesis import event, reject

    summary = record_field_refusal(reason)
    event(f"jaxstruct: {summary}")
    reject()


@st.composite
def _draw_array(
    draw: Callable[..., Any], request: ArrayRequest, sizes: dict[str, Any], kind: str
) -> Any:
    checks = request.checks
    sizes = resolve_sizes(sizes)
    choices = options_of(sizes).pick_dtypes(request.dtypes)
    if not checks.empty:
        choices = feasible_dtypes(choices, checks) or feasible_dtypes(request.dtypes, checks)
    if kind == "jax":
        choices = tuple(d for d in choices if jax_dtypes_ok(d)) or (
            ("float32",) if checks.empty or feasible_dtypes(("float32",), checks) else choices
        )
    name = draw(_one_of(choices or ("float32",)))
    shape = _shape(request.dims, sizes, draw, checks.structure)
    if shape is None:
        _discard(
            f"{checks.structure}: the sizes drawn give no shape {_dims_text(request.dims)} "
            "holding one"
        )
    if not checks.empty:
        value = values_for(draw, name, shape, checks)
        if value is None:
            _discard(f"{checks.structure}: shape {shape} holds no such value")
    elif name == "bfloat16":
        import ml_dtypes

        bits = draw(hnp.arrays(np.uint16, shape))
        value = bits.view(ml_dtypes.bfloat16)
    else:
        value = draw(array_strategy(name, shape, _elements(np.dtype(name))))
    if kind == "jax":
        import jax.numpy as jnp

        return jnp.asarray(value)
    return value


def _dims_text(dims: tuple[Any, ...] | None) -> str:
    if dims is None:
        return "any shape"
    return "(" + " ".join(str(getattr(d, "name", getattr(d, "size", "_"))) for d in dims) + ")"


@st.composite
def _draw_key(draw: Callable[..., Any], request: ArrayRequest, sizes: dict[str, Any]) -> Any:
    """Typed PRNG keys: ``jax.random.key(seed)``, or key data wrapped for a batch of keys."""
    import jax

    impl = request.dtypes[0] or None
    shape = _shape(request.dims, resolve_sizes(sizes), draw)
    assert shape is not None  # no structure: every shape fits
    if shape == ():
        return jax.random.key(draw(st.integers(0, 2**32 - 1)), impl=impl)
    data_shape = jax.random.key_data(jax.random.key(0, impl=impl)).shape
    data = draw(hnp.arrays(np.uint32, shape + data_shape))
    return jax.random.wrap_key_data(data, impl=impl)


def _checks_text(checks: Checks) -> str:
    parts = []
    if checks.bounded:
        parts.append(f"the bounds {checks.bounds().interval()}")
    if checks.structure:
        parts.append(checks.structure)
    if checks.finite:
        parts.append("finite")
    return " and ".join(parts) or "its checks"


def merge_requests(requests: list[ArrayRequest]) -> ArrayRequest:
    """One request drawing what any of ``requests`` allows (the array members of a union)."""
    kinds = {r.kind for r in requests}
    kind = kinds.pop() if len(kinds) == 1 else "any"
    dtypes = tuple(dict.fromkeys(d for r in requests for d in r.dtypes))
    dims = next((r.dims for r in requests if r.dims is not None), None)
    checks = NOTHING
    for r in requests:
        checks = checks.merge(r.checks)
    return ArrayRequest(kind, dtypes, dims, checks)


def numpy_scalars(annotation: Any) -> st.SearchStrategy[Any] | None:
    """NumPy scalars of a scalar type (``np.float32``) or family (``np.number``), else ``None``.

    Hypothesis draws the concrete types itself but cannot draw a family
    (``np.number``, ``np.floating``): this draws one of the dtypes it holds.

    Example:
        >>> from hypothesis import find
        >>> x = find(numpy_scalars(np.floating), lambda x: x.dtype == np.float16)
        >>> type(x).__name__
        'float16'
    """
    if not (isinstance(annotation, type) and issubclass(annotation, np.generic)):
        return None
    names = [d for d in DEFAULT_DTYPES if d != "bfloat16" and np.issubdtype(d, annotation)]
    if not names:
        return None
    return (
        st.sampled_from(names)
        .flatmap(lambda name: hnp.arrays(np.dtype(name), (), elements=_elements(np.dtype(name))))
        .map(lambda a: a[()])
    )


def arrays_for(request: ArrayRequest, sizes: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Return a strategy of arrays satisfying ``request``; ``sizes`` shares named dims.

    Raises:
        TypeError: no dtype or shape the request allows holds values satisfying its checks.
    """
    checks = request.checks
    if not checks.empty and request.kind != "key":
        if not feasible_dtypes(request.dtypes, checks):
            raise TypeError(
                f"no dtype among {', '.join(request.dtypes)} holds values satisfying "
                f"{_checks_text(checks)}"
            )
        if not structure_fits(request.dims, checks.structure):
            raise TypeError(
                f"no shape {_dims_text(request.dims)} holds a {checks.structure} value "
                "(square matrices need two axes of one size, a simplex one axis of entries)"
            )
    if request.kind == "key":
        return _draw_key(request, sizes)
    if request.kind == "any":
        return st.sampled_from(("numpy", "jax")).flatmap(
            lambda kind: _draw_array(request, sizes, kind)
        )
    return _draw_array(request, sizes, request.kind)


def arrays(
    annotation: Any,
    /,
    *,
    sizes: Any = None,
    dtypes: Any = None,
    elements: st.SearchStrategy[Any] | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
) -> st.SearchStrategy[Any]:
    """Return a strategy of arrays matching an array annotation, as ``structs()`` draws them.

    Constraints in ``Annotated`` metadata are satisfied by construction:
    ``Annotated[Float[Array, "n n"], positive_definite]`` draws covariances,
    ``Annotated[Float[Array, "n"], Ge(0), Le(1)]`` (``annotated_types``) or
    ``bounded(0, 1)`` bounds every element.

    Args:
        annotation: ``np.ndarray``, ``jax.Array`` or a jaxtyping annotation such as
            ``Float[Array, "n 3"]`` (array type, dtype family and shape) or
            ``Key[Array, ""]`` (typed PRNG keys), or a union with one of them
            (``jax.typing.ArrayLike``: arrays of its array members), possibly
            wrapped in ``Annotated`` with constraints.
        sizes: the named and free sizes: an int, a few ints (``(2, 5)``), a
            ``range``, a strategy of ints, or a mapping from size names to those.
            By default 0 to 3, rarely 0.
        dtypes: the dtypes to draw, among those the annotation allows.
        elements: a strategy of the elements (each must fit the drawn dtype exactly,
            as for ``hypothesis.extra.numpy.arrays``).
        min_value: the least element (inclusive).
        max_value: the greatest element (inclusive).

    Returns:
        A strategy of arrays; the named sizes of one array agree with each other.

    Raises:
        TypeError: ``annotation`` is not an array annotation, an option has the
            wrong type, ``elements`` comes with bounds, or no dtype or shape it
            allows satisfies its constraints.

    Example:
        >>> from hypothesis import given, settings
        >>> from jaxtyping import Array, Float
        >>> from jaxstruct.testing import arrays
        >>> unit = arrays(Float[Array, "n 3"], sizes=2, dtypes="float32", min_value=-1, max_value=1)
        >>> @settings(max_examples=5)
        ... @given(unit)
        ... def test(x):
        ...     assert x.shape == (2, 3) and x.dtype == "float32" and abs(x).max() <= 1
        >>> test()
    """
    from ._checks import checks_from

    checks = NOTHING
    base = annotation
    if typing.get_origin(base) is typing.Annotated:
        base, *metadata = typing.get_args(base)
        checks = checks_from(metadata)
    request = array_request(base)
    if request is None and typing.get_origin(base) in (typing.Union, types.UnionType):
        found = [r for r in map(array_request, typing.get_args(base)) if r is not None]
        request = merge_requests(found) if found else None
    if request is None:
        raise TypeError(
            f"arrays() expected an array annotation (np.ndarray, jax.Array, a jaxtyping type "
            f"such as Float[Array, 'n 3'], or a union with one such as jax.typing.ArrayLike), "
            f"got {annotation!r}"
        )
    if elements is not None:
        if min_value is not None or max_value is not None:
            raise TypeError(
                "arrays(): elements= comes with min_value=/max_value=; bound the elements "
                "strategy itself (st.floats(-1, 1, width=32)), or drop elements="
            )
        if not isinstance(elements, st.SearchStrategy):
            raise TypeError(f"arrays(): elements= expected a strategy, got {elements!r}")
        checks = checks.merge(Checks(elements=elements))
    if min_value is not None or max_value is not None:
        checks = checks.merge(Checks(lo=_bound(min_value), hi=_bound(max_value)))
    request = request.with_checks(checks)
    options = DrawOptions(sizes, dtypes)
    arrays_for(request, SizeTable(options))  # refuses, now, what no draw could satisfy
    return st.builds(SizeTable, st.just(options)).flatmap(lambda table: arrays_for(request, table))


def _bound(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"arrays(): expected a number as a bound, got {value!r}")
    return float(value)
