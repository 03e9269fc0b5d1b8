"""Property: load(export(x)) == x leaf by leaf, for generated Struct classes and values."""

from __future__ import annotations

import itertools
from typing import Any

import hypothesis.extra.numpy as hnp
import jaxstruct.core as js
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_names = itertools.count()

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.complex_numbers(allow_nan=True),
    st.text(),
    st.binary(max_size=16),
)
hashables = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.binary(max_size=4)
)
arrays = hnp.arrays(
    dtype=st.one_of(
        hnp.scalar_dtypes(), hnp.byte_string_dtypes(max_len=3), hnp.unicode_string_dtypes(max_len=3)
    ),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3),
)
leaves = st.one_of(scalars, arrays)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(hashables, children, max_size=4),
        st.frozensets(hashables, max_size=4),
    )


values = st.recursive(leaves, _containers, max_leaves=12)


@st.composite
def struct_classes(draw: st.DrawFn) -> type:
    """A freshly defined Struct class with node and static fields."""
    n_node = draw(st.integers(0, 3))
    n_static = draw(st.integers(0, 2))
    namespace: dict[str, Any] = {"__annotations__": {}}
    for i in range(n_node):
        namespace["__annotations__"][f"n{i}"] = Any
    for i in range(n_static):
        namespace["__annotations__"][f"s{i}"] = Any
        namespace[f"s{i}"] = js.field(static=True, default=None)
    return type(f"Generated{next(_names)}", (js.Struct,), namespace)


@st.composite
def struct_values(draw: st.DrawFn) -> Any:
    """An instance of a generated Struct class, possibly nesting another."""
    cls = draw(struct_classes())
    kwargs: dict[str, Any] = {}
    for name, spec in js.fields(cls).items():
        if spec.kind == js.FieldKind.STATIC:
            kwargs[name] = draw(hashables)
        else:
            kwargs[name] = draw(
                st.one_of(
                    values,
                    struct_classes().flatmap(
                        lambda c: st.just(
                            c(
                                **{
                                    n: 1
                                    for n, f in js.fields(c).items()
                                    if f.kind != js.FieldKind.STATIC
                                }
                            )
                        )
                    ),
                )
            )
    return cls(**kwargs)


SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(value=values)
def test_values_round_trip(value: Any, roundtrip, same) -> None:
    """Generated nested values come back exactly."""
    same(value, roundtrip(value))


@SETTINGS
@given(value=struct_values())
def test_generated_structs_round_trip(value: Any, roundtrip, same) -> None:
    """Instances of generated Struct classes come back exactly, class included."""
    out = roundtrip(value)
    assert type(out) is type(value)
    same(value, out)


@SETTINGS
@given(arr=arrays)
def test_arrays_keep_dtype_and_bits(arr: np.ndarray, roundtrip, same) -> None:
    """Generated arrays keep dtype, shape and bits."""
    same(arr, roundtrip(arr))
