"""optree interoperability (reference 003): structs and registered classes are optree pytrees."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import pytest

optree = pytest.importorskip("optree")

NS = "jaxstruct-tests"


class State(js.Struct, optree_namespace=NS):
    topic: str
    draft: str


class F32Array(js.Struct, optree_namespace=NS):
    values: tuple
    shape: tuple = js.field(static=True)
    dtype: str = js.field(static=True, default="float32")


class Model(js.Struct):
    w: object
    b: object
    step: int = js.field(static=True, default=0)
    cache: object = js.field(pytree=False, default=None)


@pytest.fixture
def restore_default() -> Iterator[None]:
    previous = js.set_optree_namespace("")
    yield
    js.set_optree_namespace(previous)


def test_namespaced_tree_map() -> None:
    """tree_map(f, s, namespace=NS) maps the node fields of a class registered in NS."""
    state = State(topic="dna", draft="short")
    upper = optree.tree_map(str.upper, state, namespace=NS)
    assert upper == State(topic="DNA", draft="SHORT")


def test_method_bearing_struct() -> None:
    """A struct with methods is a container for optree; its methods keep working."""

    class Explainer(js.Struct, optree_namespace=NS):
        instruction: str
        style: str

        def __call__(self, topic: str) -> str:
            return f"{self.instruction}\nstyle: {self.style}\ntopic: {topic}"

    loud = optree.tree_map(str.upper, Explainer(instruction="explain", style="brief"), namespace=NS)
    assert loud("dna") == "EXPLAIN\nstyle: BRIEF\ntopic: dna"


def test_static_fields_live_in_treespec() -> None:
    """Static fields are metadata: kept through tree_map and not mapped."""
    array = F32Array(values=(1.0, 2.0), shape=(2,))
    scaled = optree.tree_map(lambda x: x * 10, array, namespace=NS)
    assert scaled == F32Array(values=(10.0, 20.0), shape=(2,))
    assert optree.tree_leaves(array, namespace=NS) == [1.0, 2.0]


def test_static_difference_changes_treespec() -> None:
    """Instances differing in a static field have different tree specs."""
    a = optree.tree_structure(F32Array(values=(1.0,), shape=(1,)), namespace=NS)
    b = optree.tree_structure(F32Array(values=(1.0,), shape=(2,)), namespace=NS)
    assert a != b


def test_namespace_isolates_from_global() -> None:
    """Without the namespace, a class registered only in NS is a single leaf."""
    state = State(topic="dna", draft="short")
    assert optree.tree_leaves(state) == [state]


def test_global_registration_matches_jax() -> None:
    """By default a struct is in optree's global registry and flattens exactly as in JAX."""
    m = Model(w=jnp.ones(2), b=(1.0, None), step=3)
    assert optree.tree_leaves(m) == jax.tree_util.tree_leaves(m)
    assert optree.tree_structure(m).num_leaves == jax.tree_util.tree_structure(m).num_leaves


def test_global_class_works_in_any_namespace() -> None:
    """A globally registered class is also a node when a namespace is passed."""
    m = Model(w=1.0, b=2.0)
    assert optree.tree_map(lambda x: x + 1, m, namespace="anything") == Model(w=2.0, b=3.0)


def test_tree_map_like_jax() -> None:
    """optree.tree_map and jax.tree.map give equal results, static and opaque kept."""
    cache = object()
    m = Model(w=1.0, b=[2.0, 3.0], step=5, cache=cache)
    via_optree = optree.tree_map(lambda x: x * 2, m)
    assert via_optree == jax.tree.map(lambda x: x * 2, m)
    assert via_optree.step == 5
    assert via_optree.cache is cache


def test_unflatten_round_trip() -> None:
    """tree_flatten / tree_unflatten rebuild an equal struct without running hooks."""

    class Checked(js.Struct):
        x: object = js.field(validator=lambda v: v > 0)

    _, spec = optree.tree_flatten(Checked(x=1))
    rebuilt = optree.tree_unflatten(spec, [-5])
    assert rebuilt.x == -5


def test_paths_are_field_names() -> None:
    """Path entries of struct children are the node field names."""
    m = Model(w=1.0, b={"k": 2.0})
    assert optree.tree_paths(m) == [("w",), ("b", "k")]


def test_accessors_read_attributes() -> None:
    """Accessors built by optree read struct fields as attributes."""
    m = Model(w=1.0, b=2.0)
    accessors = optree.tree_accessors(m)
    assert [a(m) for a in accessors] == [1.0, 2.0]


def test_subclass_inherits_namespace() -> None:
    """A subclass of a namespaced struct is registered in the same namespace."""

    class Draft(State):
        note: str = "n"

    assert js.optree_namespace(Draft) == NS
    assert optree.tree_leaves(Draft(topic="a", draft="b"), namespace=NS) == ["a", "b", "n"]


def test_opt_out_with_none() -> None:
    """optree_namespace=None keeps a class out of optree."""

    class Hidden(js.Struct, optree_namespace=None):
        x: int

    h = Hidden(x=1)
    assert optree.tree_leaves(h) == [h]
    assert jax.tree_util.tree_leaves(h) == [1]


def test_bad_namespace_keyword_fails() -> None:
    """A non-string optree_namespace raises StructDefinitionError (a TypeError) at definition."""
    with pytest.raises(js.StructDefinitionError, match="namespace string"):

        class Bad(js.Struct, optree_namespace=3):
            x: int


def test_register_class_is_registered() -> None:
    """register_class classes are optree pytrees too."""

    @js.register_class
    class Params:
        weights: object
        scale: float = js.field(static=True, default=1.0)

    assert optree.tree_map(lambda x: x + 1, Params(weights=1.0)) == Params(weights=2.0)


def test_register_pytree_type_is_registered() -> None:
    """Classes given to register_pytree_type flatten with their own functions in optree."""

    class Pair:
        def __init__(self, a: object, b: object) -> None:
            self.a, self.b = a, b

    js.register_pytree_type(
        Pair, flatten=lambda p: ((p.a, p.b), None), unflatten=lambda _, ch: Pair(*ch)
    )
    out = optree.tree_map(str.upper, Pair("x", "y"))
    assert (out.a, out.b) == ("X", "Y")


def test_reregistered_type_uses_new_functions() -> None:
    """Registering a foreign class again changes its optree flattening too."""

    class Twice:
        def __init__(self, a: object, b: object) -> None:
            self.a, self.b = a, b

    js.register_pytree_type(
        Twice, flatten=lambda p: ((p.a,), p.b), unflatten=lambda aux, ch: Twice(ch[0], aux)
    )
    assert optree.tree_leaves(Twice(1, 2)) == [1]
    js.register_pytree_type(
        Twice, flatten=lambda p: ((p.a, p.b), None), unflatten=lambda _, ch: Twice(*ch)
    )
    assert optree.tree_leaves(Twice(1, 2)) == [1, 2]


def test_register_attrs_type_is_registered() -> None:
    """Classes given to register_attrs_type are optree pytrees with attribute paths."""

    class Edge:
        def __init__(self, flux: object, source: int) -> None:
            self.flux, self.source = flux, source

    js.register_attrs_type(Edge, node_fields=("flux",), static_fields=("source",))
    out = optree.tree_map(lambda x: x * 2, Edge(1.5, source=7))
    assert (out.flux, out.source) == (3.0, 7)
    assert optree.tree_paths(Edge(1.5, source=7)) == [("flux",)]


def test_set_default_namespace_moves_classes(restore_default: None) -> None:
    """set_optree_namespace moves classes on the default into the new namespace."""
    m = Model(w=1.0, b=2.0)
    js.set_optree_namespace("elsewhere")
    assert optree.tree_leaves(m) == [m]
    assert optree.tree_leaves(m, namespace="elsewhere") == [1.0, 2.0]
    js.set_optree_namespace("")
    assert optree.tree_leaves(m) == [1.0, 2.0]


def test_set_default_namespace_keeps_explicit_choice(restore_default: None) -> None:
    """A class that chose its namespace is not moved by set_optree_namespace."""
    js.set_optree_namespace("elsewhere")
    assert optree.tree_leaves(State(topic="a", draft="b"), namespace=NS) == ["a", "b"]


def test_set_default_namespace_rejects_non_strings() -> None:
    """set_optree_namespace(3) raises TypeError."""
    with pytest.raises(TypeError, match="namespace string"):
        js.set_optree_namespace(3)  # type: ignore[arg-type]
