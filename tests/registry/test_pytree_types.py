"""register_pytree_type, register_attrs_type, is_registered_pytree_type, resolve_pytree_spec."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxstruct.registry as reg
import pytest
from jax.tree_util import GetAttrKey


def _node_class() -> type:
    class Node:
        def __init__(self, data: object, tag: object) -> None:
            self.data = data
            self.tag = tag

    return Node


def _register_node(cls: type, **extra: object) -> type:
    return reg.register_pytree_type(
        cls,
        flatten=lambda obj: ([obj.data], obj.tag),
        unflatten=lambda aux, children: cls(children[0], aux),
        **extra,  # type: ignore[arg-type]
    )


# -- register_pytree_type ------------------------------------------------------------


def test_register_pytree_type_makes_a_pytree() -> None:
    """After registration JAX flattens the class with the given function."""
    Node = _register_node(_node_class())
    leaves = jax.tree_util.tree_leaves(Node(jnp.ones(3), "x"))
    assert len(leaves) == 1 and leaves[0].shape == (3,)


def test_register_pytree_type_returns_the_class() -> None:
    """register_pytree_type returns the class itself."""
    cls = _node_class()
    assert _register_node(cls) is cls


def test_registered_type_unflattens() -> None:
    """tree_map rebuilds instances through the unflatten function."""
    Node = _register_node(_node_class())
    out = jax.tree_util.tree_map(lambda v: v + 1, Node(1, "t"))
    assert type(out) is Node and (out.data, out.tag) == (2, "t")


def test_registered_type_works_under_jit() -> None:
    """A registered type passes through jit."""
    Node = _register_node(_node_class())
    out = jax.jit(lambda n: n.data * 2)(Node(jnp.ones(2), "t"))
    assert jnp.array_equal(out, 2 * jnp.ones(2))


def test_default_key_paths_are_flattened_index_keys() -> None:
    """Without flatten_with_keys, children get FlattenedIndexKey paths."""
    Node = _register_node(_node_class())
    ((path, _),) = jax.tree_util.tree_flatten_with_path(Node(1, "t"))[0]
    assert path == (jax.tree_util.FlattenedIndexKey(0),)


def test_flatten_with_keys_gives_key_paths() -> None:
    """flatten_with_keys supplies the key paths used by tree_flatten_with_path."""
    Node = _register_node(
        _node_class(),
        flatten_with_keys=lambda obj: ([(GetAttrKey("data"), obj.data)], obj.tag),
    )
    ((path, leaf),) = jax.tree_util.tree_flatten_with_path(Node(5, "t"))[0]
    assert path == (GetAttrKey("data"),) and leaf == 5


def test_serializer_and_deserializer_stored_on_spec() -> None:
    """serializer/deserializer are stored on the resolved spec."""
    ser = lambda obj: {"tag": obj.tag}
    cls = _node_class()
    de = lambda payload, children: cls(children[0], payload["tag"])
    _register_node(cls, serializer=ser, deserializer=de)
    spec = reg.resolve_pytree_spec(cls)
    assert spec.serializer is ser and spec.deserializer is de


def test_serializer_without_deserializer_is_rejected() -> None:
    """serializer and deserializer must be given together."""
    with pytest.raises(reg.RegistrationError, match="together"):
        _register_node(_node_class(), serializer=lambda obj: {})


def test_non_callable_flatten_is_rejected() -> None:
    """A non-callable flatten raises RegistrationError (also a TypeError)."""
    with pytest.raises(reg.RegistrationError, match="flatten") as info:
        reg.register_pytree_type(_node_class(), flatten=3, unflatten=lambda a, c: None)  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError)


def test_register_non_class_is_rejected() -> None:
    """register_pytree_type of a non-class raises RegistrationError."""
    with pytest.raises(reg.RegistrationError, match="expected a class"):
        reg.register_pytree_type(3, flatten=len, unflatten=len)  # type: ignore[arg-type]


def test_reregistering_replaces_functions() -> None:
    """Registering the same class again makes JAX use the new functions."""
    cls = _node_class()
    _register_node(cls)
    reg.register_pytree_type(
        cls,
        flatten=lambda obj: ([obj.data, obj.tag], None),
        unflatten=lambda aux, children: cls(*children),
    )
    assert jax.tree_util.tree_leaves(cls(1, 2)) == [1, 2]


def test_class_registered_outside_jaxstruct_is_a_registration_error() -> None:
    """A class JAX already knows from elsewhere cannot be registered again."""

    class Foreign:
        pass

    jax.tree_util.register_pytree_node(Foreign, lambda o: ((), None), lambda a, c: Foreign())
    with pytest.raises(reg.RegistrationError, match="Foreign"):
        reg.register_pytree_type(Foreign, flatten=lambda o: ((), None), unflatten=lambda a, c: 0)


# -- register_attrs_type -------------------------------------------------------------


def _edge_class() -> type:
    class Edge:
        def __init__(self, flux: object, source: int, target: int) -> None:
            self.flux = flux
            self.source = source
            self.target = target

    return Edge


def test_attrs_type_node_fields_are_leaves() -> None:
    """Node attributes become leaves, static ones aux data."""
    Edge = reg.register_attrs_type(
        _edge_class(), node_fields=("flux",), static_fields=("source", "target")
    )
    assert jax.tree_util.tree_leaves(Edge(jnp.array(1.5), 0, 3)) == [jnp.array(1.5)]


def test_attrs_type_static_fields_in_treedef() -> None:
    """Different static attribute values give different tree structures."""
    Edge = reg.register_attrs_type(_edge_class(), node_fields=("flux",), static_fields=("source",))
    a = jax.tree_util.tree_structure(Edge(1.0, 0, 0))
    assert a != jax.tree_util.tree_structure(Edge(1.0, 1, 0))


def test_attrs_type_key_paths() -> None:
    """Node attributes get GetAttrKey paths."""
    Edge = reg.register_attrs_type(_edge_class(), node_fields=("flux",), static_fields=("source",))
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(Edge(1.0, 0, 3))[0]]
    assert paths == [(GetAttrKey("flux"),)]


def test_attrs_type_rebuilds_without_calling_init() -> None:
    """Without a constructor, instances are rebuilt without running __init__."""
    calls: list[int] = []

    class Checked:
        def __init__(self, x: float) -> None:
            calls.append(1)
            if not isinstance(x, float):
                raise TypeError("x must be a float")
            self.x = x

    reg.register_attrs_type(Checked, node_fields=("x",))
    out = jax.tree_util.tree_map(lambda v: None, Checked(1.0))
    assert out.x is None and calls == [1]


def test_attrs_type_rebuild_keeps_statics() -> None:
    """tree_map keeps static attributes."""
    Edge = reg.register_attrs_type(
        _edge_class(), node_fields=("flux",), static_fields=("source", "target")
    )
    out = jax.tree_util.tree_map(lambda v: v + 1, Edge(1.5, source=0, target=3))
    assert (out.flux, out.source, out.target) == (2.5, 0, 3)


def test_attrs_type_with_constructor() -> None:
    """A constructor rebuilds instances from the attribute mapping."""
    seen: list[dict] = []
    cls = _edge_class()

    def construct(values: dict) -> object:
        seen.append(dict(values))
        return cls(values["flux"], values["source"], values["target"])

    reg.register_attrs_type(
        cls, node_fields=("flux",), static_fields=("source", "target"), constructor=construct
    )
    out = jax.tree_util.tree_map(lambda v: v * 2, cls(2.0, 1, 2))
    assert out.flux == 4.0
    assert seen == [{"flux": 4.0, "source": 1, "target": 2}]


def test_attrs_type_spec_lists_fields() -> None:
    """The spec of an attrs type lists its node and static attribute names."""
    cls = reg.register_attrs_type(_edge_class(), node_fields=("flux",), static_fields=("source",))
    spec = reg.resolve_pytree_spec(cls)
    assert spec.node_fields == ("flux",) and spec.static_fields == ("source",)


def test_attrs_type_overlapping_names_rejected() -> None:
    """An attribute listed as both node and static is rejected."""
    with pytest.raises(reg.RegistrationError, match="flux"):
        reg.register_attrs_type(_edge_class(), node_fields=("flux",), static_fields=("flux",))


def test_attrs_type_string_instead_of_sequence_rejected() -> None:
    """A bare string for node_fields is rejected (it would be split into letters)."""
    with pytest.raises(reg.RegistrationError, match="sequence"):
        reg.register_attrs_type(_edge_class(), node_fields="flux")


def test_attrs_type_non_identifier_rejected() -> None:
    """Names must be attribute names."""
    with pytest.raises(reg.RegistrationError):
        reg.register_attrs_type(_edge_class(), node_fields=("not a name",))


# -- queries -------------------------------------------------------------------------


def test_is_registered_pytree_type() -> None:
    """is_registered_pytree_type is True after registration and False for others."""
    cls = _node_class()
    assert not reg.is_registered_pytree_type(cls)
    _register_node(cls)
    assert reg.is_registered_pytree_type(cls)
    assert not reg.is_registered_pytree_type(int)


def test_resolve_pytree_spec_attributes() -> None:
    """resolve_pytree_spec returns .cls, .flatten, .unflatten, .flatten_with_keys and the rest."""
    flatten = lambda obj: ([obj.data], obj.tag)
    cls = _node_class()
    unflatten = lambda aux, children: cls(children[0], aux)
    fwk = lambda obj: ([(GetAttrKey("data"), obj.data)], obj.tag)
    reg.register_pytree_type(cls, flatten=flatten, unflatten=unflatten, flatten_with_keys=fwk)
    spec = reg.resolve_pytree_spec(cls)
    assert spec.cls is cls
    assert spec.flatten is flatten and spec.unflatten is unflatten
    assert spec.flatten_with_keys is fwk
    assert spec.serializer is None and spec.deserializer is None


def test_resolve_pytree_spec_by_reference() -> None:
    """resolve_pytree_spec accepts the class reference string."""
    cls = _register_node(_node_class())
    assert reg.resolve_pytree_spec(reg.class_ref(cls)).cls is cls


def test_registration_puts_class_in_reference_cache() -> None:
    """A registered type is resolvable from its reference without importing."""
    cls = _register_node(_node_class())
    assert reg.lookup_class(reg.class_ref(cls)) is cls


def test_resolve_pytree_spec_unregistered_class() -> None:
    """resolve_pytree_spec of an unregistered class raises ClassReferenceError with the fixes."""
    with pytest.raises(reg.ClassReferenceError, match="register_pytree_type"):
        reg.resolve_pytree_spec(int)


def test_struct_spec_via_core() -> None:
    """Struct subclasses have a spec of kind 'struct' with their field names."""
    import jaxstruct.core as js

    class P(js.Struct):
        x: object
        n: int = js.field(static=True, default=0)

    spec = reg.resolve_pytree_spec(P)
    assert spec.cls is P and spec.kind == "struct"
    assert spec.node_fields == ("x",) and spec.static_fields == ("n",)
    children, aux = spec.flatten(P(1.0))
    assert tuple(children) == (1.0,)
    assert spec.unflatten(aux, children).x == 1.0


def test_registered_pytree_types_lists_in_order() -> None:
    """registered_pytree_types lists classes in registration order."""
    a, b = _node_class(), _node_class()
    _register_node(a)
    _register_node(b)
    listed = reg.registered_pytree_types()
    assert listed.index(a) < listed.index(b)


def test_registration_listener_sees_existing_and_new_specs() -> None:
    """A listener is called for current specs and for later registrations."""
    seen: list[type] = []
    existing = _register_node(_node_class())
    reg.add_registration_listener(lambda spec: seen.append(spec.cls))
    later = _register_node(_node_class())
    assert existing in seen and later in seen
