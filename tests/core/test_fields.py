"""field() options, default rules, FieldSpec attributes and introspection."""

from __future__ import annotations

import inspect
from collections import OrderedDict

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import pytest


class State(js.Struct):
    params: object
    step: int = js.field(static=True, default=0)
    tag: str = js.field(static=True, default="run")


class Config(js.Struct):
    weights: object
    n_layers: int = js.field(static=True, default=2)
    cache: object = js.field(pytree=False, default_factory=dict, compare=False)
    size: int = js.field(static=True, init=False, derived=lambda self: self.n_layers * 2)


# -- kinds ---------------------------------------------------------------------------


def test_plain_annotation_is_a_node_field() -> None:
    """A field declared by annotation alone is a node field."""
    assert js.fields(State)["params"].kind is js.FieldKind.NODE


def test_static_true_makes_a_static_field() -> None:
    """field(static=True) gives FieldKind.STATIC."""
    assert js.fields(State)["step"].kind is js.FieldKind.STATIC


def test_pytree_false_makes_an_opaque_field() -> None:
    """field(pytree=False) gives FieldKind.OPAQUE."""
    assert js.fields(Config)["cache"].kind is js.FieldKind.OPAQUE


def test_field_kind_has_three_members() -> None:
    """FieldKind has exactly NODE, STATIC and OPAQUE."""
    assert {k.name for k in js.FieldKind} == {"NODE", "STATIC", "OPAQUE"}


def test_static_and_not_pytree_together_is_a_definition_error() -> None:
    """static=True with pytree=False is rejected at class definition, naming class and field."""
    with pytest.raises(js.StructDefinitionError, match=r"Bad.*'x'"):

        class Bad(js.Struct):
            x: int = js.field(static=True, pytree=False, default=0)


def test_field_arguments_are_keyword_only() -> None:
    """Every field() argument is keyword-only."""
    params = inspect.signature(js.field).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)


def test_field_accepts_every_documented_option() -> None:
    """field() takes every option the specification lists."""
    documented = {
        "static",
        "pytree",
        "default",
        "default_factory",
        "init",
        "repr",
        "compare",
        "serialize",
        "kw_only",
        "doc",
        "metadata",
        "converter",
        "validator",
        "derived",
    }
    assert documented <= set(inspect.signature(js.field).parameters)


def test_field_returns_a_fieldspec() -> None:
    """field() returns a FieldSpec."""
    assert isinstance(js.field(default=1), js.FieldSpec)


# -- defaults ------------------------------------------------------------------------


def test_default_is_used_when_argument_omitted() -> None:
    """A field with default= takes that value when the constructor omits it."""
    assert State(params=1).tag == "run"


def test_plain_class_attribute_is_a_default() -> None:
    """An annotated class attribute without field() is the field's default."""

    class P(js.Struct):
        x: int = 5

    assert P().x == 5


def test_default_factory_is_called_per_instance() -> None:
    """default_factory is called afresh for each instance."""

    class P(js.Struct):
        items: list = js.field(default_factory=list)

    a, b = P(), P()
    assert a.items == [] and a.items is not b.items


def test_default_factory_not_called_when_value_given() -> None:
    """default_factory is not called when the constructor receives a value."""
    calls = []

    class P(js.Struct):
        items: list = js.field(default_factory=lambda: calls.append(1) or [])

    P(items=[1])
    assert calls == []


def test_required_field_missing_raises_type_error() -> None:
    """A field without default or factory must be passed to the constructor."""
    with pytest.raises(TypeError, match="params"):
        State()  # type: ignore[call-arg]


def test_default_and_default_factory_are_exclusive() -> None:
    """default and default_factory together are a definition error naming class and field."""
    with pytest.raises(js.StructDefinitionError, match=r"Bad.*'x'.*default_factory"):

        class Bad(js.Struct):
            x: list = js.field(default=[], default_factory=list)


def test_mutable_plain_default_is_rejected() -> None:
    """A bare list default is rejected with the default_factory fix."""
    with pytest.raises(js.StructDefinitionError, match=r"Bad.*'x'.*default_factory"):

        class Bad(js.Struct):
            x: list = []


def test_non_callable_default_factory_is_rejected() -> None:
    """A default_factory that is not callable is a definition error."""
    with pytest.raises(js.StructDefinitionError, match="'x'"):

        class Bad(js.Struct):
            x: int = js.field(default_factory=3)


def test_init_false_field_takes_its_default() -> None:
    """An init=False field is not a constructor parameter and takes its default."""

    class P(js.Struct):
        x: int
        y: int = js.field(init=False, default=7)

    assert P(1).y == 7
    with pytest.raises(TypeError):
        P(1, y=3)  # type: ignore[call-arg]


def test_init_false_field_can_be_set_in_post_init() -> None:
    """An init=False field without default may be assigned in __post_init__."""

    class P(js.Struct):
        x: int
        y: int = js.field(init=False)

        def __post_init__(self) -> None:
            self.y = self.x + 1

    assert P(1).y == 2


def test_init_false_field_never_assigned_is_a_validation_error() -> None:
    """An init=False field left unassigned is reported naming class and field."""

    class P(js.Struct):
        y: int = js.field(init=False)

    with pytest.raises(js.ValidationError, match=r"P.*'y'"):
        P()


def test_kw_only_field_is_keyword_only() -> None:
    """kw_only=True makes the constructor parameter keyword-only."""

    class P(js.Struct):
        x: int
        seed: int = js.field(static=True, kw_only=True, default=0)
        y: int = 1

    assert P(1, 2, seed=3) == P(x=1, y=2, seed=3)
    with pytest.raises(TypeError):
        P(1, 2, 3)


def test_kw_only_required_field_may_follow_a_default() -> None:
    """A required kw_only field may come after a defaulted one."""

    class P(js.Struct):
        x: int = 0
        y: int = js.field(kw_only=True)

    assert P(y=2).y == 2


def test_positional_arguments_follow_field_order() -> None:
    """Positional constructor arguments bind to init fields in declaration order."""
    s = State(1, 2, "t")
    assert (s.params, s.step, s.tag) == (1, 2, "t")


def test_constructor_signature_lists_fields() -> None:
    """inspect.signature of a struct class shows its init fields."""
    assert list(inspect.signature(Config).parameters) == ["weights", "n_layers", "cache"]


def test_repr_false_hides_field_from_repr() -> None:
    """repr=False leaves the field out of repr()."""

    class P(js.Struct):
        x: int
        token: str = js.field(static=True, repr=False, default="secret")

    assert "secret" not in repr(P(1)) and "token" not in repr(P(1))


def test_compare_false_excludes_field_from_equality() -> None:
    """compare=False leaves the field out of ==."""

    class P(js.Struct):
        x: int
        debug: str = js.field(static=True, compare=False, default="")

    assert P(1, "a") == P(1, "b")


def test_compare_false_excludes_field_from_hash() -> None:
    """compare=False leaves the field out of hash()."""

    class P(js.Struct):
        x: int
        debug: str = js.field(static=True, compare=False, default="")

    assert hash(P(1, "a")) == hash(P(1, "b"))


def test_doc_is_stored_on_the_spec() -> None:
    """doc= is kept on the FieldSpec."""

    class P(js.Struct):
        x: int = js.field(doc="the x")

    assert js.fields(P)["x"].doc == "the x"


def test_metadata_is_a_read_only_copy() -> None:
    """metadata= is stored as a read-only mapping."""
    meta = {"unit": "m"}

    class P(js.Struct):
        x: int = js.field(metadata=meta)

    stored = js.fields(P)["x"].metadata
    assert stored == {"unit": "m"}
    meta["unit"] = "s"
    assert stored["unit"] == "m"
    with pytest.raises(TypeError):
        stored["unit"] = "km"  # type: ignore[index]


def test_field_without_annotation_is_a_definition_error() -> None:
    """Assigning field() to an unannotated name is a definition error naming it."""
    with pytest.raises(js.StructDefinitionError, match=r"Bad.*'x'.*annotat"):

        class Bad(js.Struct):
            x = js.field(default=1)


def test_classvar_is_not_a_field() -> None:
    """A ClassVar annotation declares a class attribute, not a field."""
    from typing import ClassVar

    class P(js.Struct):
        registry: ClassVar[dict] = {}
        x: int = 0

    assert list(js.fields(P)) == ["x"] and P.registry == {}


# -- FieldSpec attributes ------------------------------------------------------------


def test_fieldspec_name() -> None:
    """FieldSpec.name is the field name."""
    assert State.fields()["step"].name == "step"


def test_fieldspec_kind() -> None:
    """FieldSpec.kind is the FieldKind."""
    assert State.fields()["step"].kind is js.FieldKind.STATIC


def test_fieldspec_default() -> None:
    """FieldSpec.default is the declared default."""
    assert State.fields()["step"].default == 0


def test_fieldspec_default_is_missing_without_default() -> None:
    """FieldSpec.default is MISSING when no default is declared."""
    assert State.fields()["params"].default is js.MISSING


def test_fieldspec_has_default_true() -> None:
    """has_default is True for a default or a default_factory."""
    assert State.fields()["step"].has_default
    assert Config.fields()["cache"].has_default


def test_fieldspec_has_default_false() -> None:
    """has_default is False for a required field."""
    assert not State.fields()["params"].has_default


def test_fieldspec_is_derived() -> None:
    """is_derived is True only for derived fields."""
    assert Config.fields()["size"].is_derived
    assert not Config.fields()["n_layers"].is_derived


def test_should_serialize_by_kind() -> None:
    """Node and static fields serialise, opaque and derived ones do not."""
    specs = Config.fields()
    assert specs["weights"].should_serialize
    assert specs["n_layers"].should_serialize
    assert not specs["cache"].should_serialize
    assert not specs["size"].should_serialize


def test_serialize_override() -> None:
    """serialize=True/False overrides the kind's policy."""

    class P(js.Struct):
        params: object
        cache: object = js.field(pytree=False, serialize=True, default=None)
        debug: str = js.field(static=True, serialize=False, default="")

    assert P.fields()["cache"].should_serialize
    assert not P.fields()["debug"].should_serialize


def test_derived_field_with_serialize_true_is_rejected() -> None:
    """A derived field cannot be serialised; the declaration is rejected."""
    with pytest.raises(js.StructDefinitionError, match=r"Bad.*'n'"):

        class Bad(js.Struct):
            n: int = js.field(static=True, init=False, derived=lambda: 1, serialize=True)


# -- introspection -------------------------------------------------------------------


def test_fields_is_an_ordered_dict_of_specs() -> None:
    """Struct.fields() is an OrderedDict of name to FieldSpec in declaration order."""
    specs = State.fields()
    assert isinstance(specs, OrderedDict)
    assert list(specs) == ["params", "step", "tag"]
    assert all(isinstance(s, js.FieldSpec) for s in specs.values())


def test_node_fields() -> None:
    """node_fields() lists node field names."""
    assert State.node_fields() == ("params",)


def test_static_fields() -> None:
    """static_fields() lists static field names (derived static ones included)."""
    assert State.static_fields() == ("step", "tag")
    assert Config.static_fields() == ("n_layers", "size")


def test_opaque_fields() -> None:
    """opaque_fields() lists opaque field names."""
    assert State.opaque_fields() == ()
    assert Config.opaque_fields() == ("cache",)


def test_derived_fields() -> None:
    """derived_fields() lists derived field names."""
    assert State.derived_fields() == ()
    assert Config.derived_fields() == ("size",)


@pytest.mark.parametrize(
    "name", ["fields", "node_fields", "static_fields", "opaque_fields", "derived_fields"]
)
def test_module_level_wrappers_match_class_methods(name: str) -> None:
    """js.<name>(cls) returns the same as cls.<name>()."""
    assert getattr(js, name)(Config) == getattr(Config, name)()


@pytest.mark.parametrize(
    "name", ["fields", "node_fields", "static_fields", "opaque_fields", "derived_fields"]
)
def test_module_level_wrappers_accept_instances(name: str) -> None:
    """The module-level wrappers accept an instance as well as the class."""
    assert getattr(js, name)(Config(weights=1)) == getattr(Config, name)()


def test_module_level_wrapper_rejects_non_struct() -> None:
    """js.fields() of a plain class is a TypeError naming it."""
    with pytest.raises(TypeError, match="int"):
        js.fields(int)


def test_inherited_fields_come_first() -> None:
    """A subclass lists the parent's fields first, then its own."""

    class Child(State):
        extra: int = 0

    assert list(Child.fields()) == ["params", "step", "tag", "extra"]


# -- tree_size -----------------------------------------------------------------------


def test_tree_size_counts_leaves() -> None:
    """tree_size() equals len(jax.tree_util.tree_leaves(instance))."""
    s = State(params={"w": jnp.ones(4), "b": [jnp.zeros(2), 3.0]})
    assert s.tree_size() == len(jax.tree_util.tree_leaves(s)) == 3


def test_tree_size_ignores_static_and_opaque() -> None:
    """Static and opaque fields do not count as leaves."""
    assert Config(weights=jnp.ones(2), cache={"a": 1}).tree_size() == 1
