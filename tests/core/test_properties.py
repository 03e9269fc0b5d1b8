"""Property tests over generated struct classes and values."""

from __future__ import annotations

from typing import Any

import jax
import jaxstruct.core as js
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.core.strategies import (
    ClassDesc,
    _value_for,
    hashable_structs,
    instances_of,
    struct_classes,
    structs,
)


def _fields_identical(a: Any, b: Any) -> bool:
    for name in js.fields(a):
        x, y = getattr(a, name), getattr(b, name)
        if js.is_struct(x):
            if not _fields_identical(x, y):
                return False
        elif isinstance(x, list):
            if len(x) != len(y) or any(u is not v for u, v in zip(x, y, strict=True)):
                return False
        elif x is not y:
            return False
    return True


@given(structs())
def test_flatten_unflatten_identity(obj: Any) -> None:
    """Unflattening the flattened form rebuilds the same class with the very same values."""
    leaves, tree = jax.tree_util.tree_flatten(obj)
    rebuilt = jax.tree_util.tree_unflatten(tree, leaves)
    assert type(rebuilt) is type(obj)
    assert _fields_identical(rebuilt, obj)


@given(structs())
def test_unflattened_copy_is_equal(obj: Any) -> None:
    """A rebuilt copy compares equal to the original."""
    assert jax.tree_util.tree_map(lambda v: v, obj) == obj


@given(structs())
def test_tree_size_matches_leaves(obj: Any) -> None:
    """tree_size() equals the number of leaves."""
    assert obj.tree_size() == len(jax.tree_util.tree_leaves(obj))


@given(structs())
def test_leaf_count_ignores_static_and_opaque(obj: Any) -> None:
    """Only node fields contribute leaves."""
    expected = sum(len(jax.tree_util.tree_leaves(getattr(obj, n))) for n in js.node_fields(obj))
    assert obj.tree_size() == expected


@given(structs())
def test_key_paths_name_node_fields(obj: Any) -> None:
    """Every leaf's key path starts with GetAttrKey of a node field."""
    nodes = set(js.node_fields(obj))
    for path, _ in jax.tree_util.tree_flatten_with_path(obj)[0]:
        assert isinstance(path[0], jax.tree_util.GetAttrKey) and path[0].name in nodes


@given(st.data())
def test_replace_changes_only_the_named_field(data: st.DataObject) -> None:
    """replace(f=v) sets f to v, keeps every other field by identity, leaves the original."""
    desc: ClassDesc = data.draw(struct_classes(max_depth=1))
    if not desc.fields:
        return
    obj = data.draw(instances_of(desc))
    target = data.draw(st.sampled_from(desc.fields))
    before = {n: getattr(obj, n) for n in js.fields(obj)}
    new_value = data.draw(_value_for(target.kind))
    new = obj.replace(**{target.name: new_value})
    assert getattr(new, target.name) is new_value
    for name, value in before.items():
        assert getattr(obj, name) is value
        if name != target.name:
            assert getattr(new, name) is value


@given(structs())
def test_replace_without_changes_is_equal(obj: Any) -> None:
    """replace() with no arguments gives an equal instance of the same class."""
    copy = obj.replace()
    assert type(copy) is type(obj) and copy == obj


@given(hashable_structs())
def test_equal_instances_have_equal_hashes(drawn: tuple[Any, ClassDesc, dict[str, Any]]) -> None:
    """Two instances built from the same hashable values are equal and hash alike."""
    obj, desc, values = drawn
    twin = desc.cls(**values)
    assert obj == twin and hash(obj) == hash(twin)


@given(hashable_structs())
def test_rebuilt_hashable_instance_hashes_alike(
    drawn: tuple[Any, ClassDesc, dict[str, Any]],
) -> None:
    """A tree_map copy of a hashable instance has the same hash."""
    obj, _, _ = drawn
    assert hash(jax.tree_util.tree_map(lambda v: v, obj)) == hash(obj)


@given(structs(), structs())
def test_equality_implies_equal_hash_or_unhashable(a: Any, b: Any) -> None:
    """If two instances are equal, they hash alike or both are unhashable."""
    if a != b:
        return
    try:
        ha = hash(a)
    except TypeError:
        with pytest.raises(TypeError):
            hash(b)
        return
    assert ha == hash(b)


@given(structs())
def test_instances_are_frozen(obj: Any) -> None:
    """Every generated instance rejects assignment to each field."""
    for name in js.fields(obj):
        with pytest.raises(js.FrozenStructError):
            setattr(obj, name, None)


@given(structs())
def test_repr_does_not_raise(obj: Any) -> None:
    """repr() works for every generated instance and starts with the class name."""
    assert repr(obj).startswith(type(obj).__name__ + "(")
