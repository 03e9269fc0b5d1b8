"""Ports from flax.struct, equinox and dataclasses without surprises (issue 28, items 1-3)."""

from __future__ import annotations

import dataclasses

import jax
import jaxstruct.core as js
import pytest

# -- item 1: dataclasses.field(...) in a struct body ----------------------------------


class Params(js.Struct):
    weights: object = dataclasses.field(default_factory=lambda: [1.0])
    hidden: int = dataclasses.field(default=3, repr=False, compare=False)
    n: int = dataclasses.field(default=2, metadata={"pytree_node": False})
    k: int = dataclasses.field(default=4, metadata={"static": True})
    scale: float = dataclasses.field(default=1, metadata={"converter": float})
    cache: object = dataclasses.field(default=None, init=False)
    tag: str = dataclasses.field(default="t", kw_only=True)


def test_dataclasses_field_default_factory_and_flags_are_honoured() -> None:
    a, b = Params(), Params()
    assert a.weights == [1.0] and a.weights is not b.weights
    assert a.hidden == 3 and "hidden" not in repr(a)
    assert Params(hidden=5) == Params(hidden=6)  # compare=False
    assert a.cache is None
    with pytest.raises(TypeError):
        Params(cache=1)  # type: ignore[call-arg]  # init=False
    assert Params.fields()["tag"].kw_only


def test_dataclasses_field_metadata_makes_static_and_converts() -> None:
    """metadata pytree_node=False (flax) and static=True (equinox) make a field static."""
    assert Params.static_fields() == ("n", "k")
    assert jax.tree.leaves(Params()) == [1.0, 3, 1.0, "t"]
    assert Params(scale=2).scale == 2.0 and type(Params(scale=2).scale) is float


def test_dataclasses_field_object_is_never_a_leaf() -> None:
    """Before issue 28 the Field object itself became the default (and a pytree leaf)."""
    for leaf in jax.tree.leaves(Params()):
        assert not isinstance(leaf, dataclasses.Field)


def test_unannotated_dataclasses_field_is_an_error() -> None:
    with pytest.raises(js.StructDefinitionError, match=r"'x'.*no type annotation"):

        class Bad(js.Struct):
            x = dataclasses.field(default=1)


# -- item 3: redeclaring an inherited field ------------------------------------------


class Base(js.Struct):
    time: int
    steps: int = 1
    lr: float = js.field(static=True, default=0.1)
    scale: float = js.field(default=1.0, converter=float, validator=lambda v: v > 0)


def test_redeclaration_changing_the_default_is_accepted() -> None:
    """As in dataclasses, flax.struct and equinox: same kind, converter and validators."""

    class Child(Base):
        time: int
        steps: int = 200
        lr: float = js.field(static=True, default=0.5)
        extra: int = 0

    assert list(Child.fields()) == ["time", "steps", "lr", "scale", "extra"]
    child = Child(time=0)
    assert (child.steps, child.lr) == (200, 0.5)
    assert Child.static_fields() == ("lr",)


def test_redeclaration_keeping_converter_and_validators_is_accepted() -> None:
    parent = Base.fields()["scale"]

    class Child(Base):
        scale: float = js.field(default=2.0, converter=parent.converter, validator=parent.validator)

    assert Child(time=0).scale == 2.0
    with pytest.raises(js.ValidationError):
        Child(time=0, scale=-1)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("lr: float = 0.2", "turns a static field into a node field"),
        ("steps: int = js.field(static=True, default=2)", "turns a node field into a static"),
        ("steps: int = js.field(pytree=False, default=2)", "into an opaque field"),
        ("scale: float = 2.0", "drops the parent's converter"),
        ("scale: float = js.field(default=2.0, converter=float)", "drops the parent's valid"),
    ],
)
def test_redeclaration_changing_kind_or_dropping_checks_needs_override(
    body: str, problem: str
) -> None:
    namespace = {"js": js, "Base": Base, "__name__": "my.envs"}
    with pytest.raises(js.StructDefinitionError) as info:
        exec(f"class Child(Base):\n    {body}\n", namespace)
    message = str(info.value)
    assert problem in message
    # Both classes by module and qualified name.
    assert message.startswith("my.envs.Child:") and f"{__name__}.Base" in message
    assert "override=True" in message and "drop the annotation" in message


def test_redeclaration_error_example_keeps_the_parents_kind() -> None:
    """The example for keeping the field is the parent's declaration, never a kind change."""
    with pytest.raises(js.StructDefinitionError) as info:

        class Child(Base):
            steps: int = js.field(static=True, default=2)

    keep = str(info.value).split("To change only the default")[1].split("to replace")[0]
    assert "steps: ... = field(default=...)" in keep and "static" not in keep
    with pytest.raises(js.StructDefinitionError) as info:

        class Child2(Base):
            lr: float = 0.3

    keep = str(info.value).split("To change only the default")[1].split("to replace")[0]
    assert "lr: ... = field(static=True, default=...)" in keep


def test_override_true_still_replaces_deliberately() -> None:
    class Child(Base):
        lr: float = js.field(default=0.3, override=True)

    assert Child.static_fields() == () and Child(time=0).lr == 0.3


# -- item 2: decorators on a subclass of a struct -------------------------------------


def test_js_dataclass_on_a_struct_subclass_keeps_it() -> None:
    @js.dataclass
    class Custom(Base):
        reward: float = 1.0
        steps: int = 5

    assert issubclass(Custom, Base) and Custom(time=1).reward == 1.0
    assert Custom(time=1).steps == 5


@pytest.mark.parametrize(
    "decorator",
    [dataclasses.dataclass, dataclasses.dataclass(frozen=True)],
    ids=["plain", "frozen"],
)
def test_stdlib_dataclass_on_a_struct_subclass_says_to_drop_it(decorator) -> None:
    with pytest.raises(js.StructDefinitionError) as info:

        @decorator
        class Custom(Base):
            reward: float = 1.0

    message = str(info.value)
    assert ".<locals>.Custom: " in message and f"{__name__}.Base" in message
    assert "drop the decorator" in message


def test_redeclaration_replacing_the_converter_needs_override() -> None:
    validator = Base.fields()["scale"].validator
    with pytest.raises(js.StructDefinitionError, match="replaces the parent's converter"):

        class Child(Base):
            scale: float = js.field(default=2.0, converter=abs, validator=validator)

    class Deliberate(Base):
        scale: float = js.field(default=2.0, converter=abs, validator=validator, override=True)

    assert Deliberate(time=0, scale=-3).scale == 3
