"""struct_classes(): generated struct classes, and our own round-trip properties on them."""

import inspect

import jaxstruct.core as js
from hypothesis import given
from jaxstruct.testing import assert_pytree_roundtrip, assert_roundtrip, struct_classes, structs


@given(struct_classes())
def test_generated_classes_are_structs(cls):
    """Every generated class is a concrete struct class with at most four own fields."""
    assert js.is_struct(cls) and not inspect.isabstract(cls)
    assert len(js.fields(cls)) <= 4


@given(struct_classes(max_depth=0))
def test_depth_zero_has_no_nested_structs(cls):
    """max_depth=0 generates no struct-typed fields."""
    assert not any(
        isinstance(spec.type, type) and js.is_struct(spec.type) for spec in js.fields(cls).values()
    )


@given(struct_classes().flatmap(structs))
def test_pytree_roundtrip_of_any_struct(x):
    """Any struct value survives flatten/unflatten and jit (dogfooding structs())."""
    assert_pytree_roundtrip(x)


@given(struct_classes().flatmap(structs))
def test_io_roundtrip_of_any_struct(x):
    """load(export(x)) == x leaf by leaf, dtype and bits, for any struct value."""
    assert_roundtrip(x)
