"""register_class / dataclass: promoting an existing class to a Struct."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import pytest


class _Original:
    weights: object
    bias: object = js.field(default_factory=lambda: jnp.zeros(1))

    def norm(self) -> jax.Array:
        return jnp.sum(self.weights)


Params = js.register_class(_Original)


def test_result_is_a_struct() -> None:
    """register_class returns a Struct subclass."""
    assert issubclass(Params, js.Struct)


def test_original_class_is_first_in_mro() -> None:
    """The original class comes right after the new class in the MRO, before Struct."""
    assert Params.__mro__[1] is _Original
    assert Params.__mro__.index(_Original) < Params.__mro__.index(js.Struct)


def test_instances_are_instances_of_original() -> None:
    """Instances are instances of the original class."""
    assert isinstance(Params(weights=jnp.ones(2)), _Original)


def test_fields_come_from_annotations() -> None:
    """Annotations of the original class become fields, field() included."""
    assert list(Params.fields()) == ["weights", "bias"]


def test_default_factory_applies() -> None:
    """field(default_factory=...) on the original class works."""
    assert Params(weights=jnp.ones(4)).bias.shape == (1,)


def test_methods_of_original_work() -> None:
    """Methods of the original class work on instances."""
    assert float(Params(weights=jnp.ones(4)).norm()) == 4.0


def test_replace_available() -> None:
    """The Struct API (replace) is available."""
    p = Params(weights=jnp.ones(4)).replace(bias=jnp.zeros(4))
    assert p.bias.shape == (4,)


def test_instances_are_frozen() -> None:
    """Instances of a registered class are frozen."""
    with pytest.raises(js.FrozenStructError):
        Params(weights=1).weights = 2  # type: ignore[misc]


def test_registered_class_is_a_pytree() -> None:
    """A registered class is a pytree with node fields as leaves."""
    assert len(jax.tree_util.tree_leaves(Params(weights=jnp.ones(2)))) == 2


def test_super_calls_in_methods_work() -> None:
    """super() inside the original class's methods reaches its own bases."""

    class Greeter:
        def greet(self) -> str:
            return "base"

    @js.register_class
    class Child(Greeter):
        x: int = 0

        def greet(self) -> str:
            return "child+" + super().greet()

    assert Child().greet() == "child+base"


def test_decorator_form() -> None:
    """@register_class works as a bare decorator."""

    @js.register_class
    class P:
        x: int = 1

    assert P().x == 1 and js.is_struct(P)


def test_name_override_renames_class() -> None:
    """register_class(name=...) names the new class."""

    @js.register_class(name="TrainingParams")
    class P:
        x: int = 1

    assert P.__name__ == "TrainingParams"


def test_name_override_sets_class_ref() -> None:
    """The class reference uses the override name and resolves back to the class."""

    @js.register_class(name="TrainingParams2")
    class P:
        x: int = 1

    ref = js.class_ref(P)
    assert ref.endswith((".TrainingParams2", ":TrainingParams2"))
    assert js.resolve_class(ref) is P


def test_dataclass_alias() -> None:
    """js.dataclass is register_class."""

    @js.dataclass
    class MyConfig:
        lr: float = js.field(static=True, default=1e-3)

    assert issubclass(MyConfig, js.Struct) and MyConfig.static_fields() == ("lr",)
    assert js.dataclass is js.register_class


def test_user_init_of_original_is_kept() -> None:
    """An __init__ written in the original class is used as the constructor."""

    @js.register_class
    class P:
        x: int

        def __init__(self, v: int) -> None:
            self.x = v * 2

    assert P(2).x == 4


def test_stdlib_dataclass_keeps_fields_and_options() -> None:
    """A stdlib dataclass becomes a struct with the same fields and defaults."""

    @js.register_class
    @dataclasses.dataclass
    class P:
        x: int
        y: list = dataclasses.field(default_factory=list)
        z: str = dataclasses.field(default="", repr=False)

    p = P(1)
    assert (p.x, p.y) == (1, []) and "z=" not in repr(p)


def test_registering_a_struct_again_returns_it() -> None:
    """register_class on a struct class returns it unchanged (issue 28: a decorated subclass)."""
    assert js.register_class(Params) is Params
    assert js.dataclass(Params) is Params


def test_registering_a_struct_again_with_options_is_an_error() -> None:
    """register_class(name=..., kw_only=True) cannot change a struct class: a TypeError."""
    with pytest.raises(TypeError, match=r"already a Struct.*class keyword"):
        js.register_class(name="Other")(Params)
    with pytest.raises(TypeError, match="already a Struct"):
        js.register_class(kw_only=True)(Params)


def test_register_non_class_is_an_error() -> None:
    """register_class on a non-class is a TypeError."""
    with pytest.raises(TypeError):
        js.register_class(3)  # type: ignore[call-overload]


def test_foreign_metaclass_is_combined() -> None:
    """A class with its own metaclass is registered without a metaclass conflict."""

    class Meta(type):
        pass

    class WithMeta(metaclass=Meta):
        x: int = 0

    P = js.register_class(WithMeta)
    assert isinstance(P, Meta) and isinstance(P, js.StructMeta) and P(x=1).x == 1


def test_register_class_with_abc() -> None:
    """An abc.ABC class registers and its abstract methods stay enforced."""
    import abc

    @js.register_class
    class Solver(abc.ABC):
        lr: float = 0.1

        @abc.abstractmethod
        def step(self) -> float: ...

    with pytest.raises(TypeError, match="abstract"):
        Solver()


@pytest.mark.parametrize(
    "keywords",
    [
        {"frozen": True},
        {"eq": True, "repr": True, "order": False},
        {"unsafe_hash": True},
        {"unsafe_hash": False},
        {"slots": False, "weakref_slot": False},
        {"mappable_dataclass": False},
        {"match_args": True, "kw_only": False, "init": True},
    ],
)
def test_dataclass_and_chex_keywords_at_struct_values_are_accepted(
    keywords: dict[str, Any],
) -> None:
    """The dataclass/chex keywords at the values every struct has port unchanged."""

    @js.dataclass(**keywords)
    class P:
        x: int

    assert P(x=1).replace(x=2) == P(x=2)


@pytest.mark.parametrize(
    ("keyword", "value", "fix"),
    [
        ("frozen", False, "replace"),
        ("eq", False, "__eq__"),
        ("repr", False, "__repr__"),
        ("order", True, "total_ordering"),
        ("slots", True, "slower"),
        ("weakref_slot", True, "weak references"),
        ("mappable_dataclass", True, "to_dict"),
    ],
)
def test_keywords_a_struct_cannot_honour_are_refused(keyword: str, value: bool, fix: str) -> None:
    """Any other value is a StructDefinitionError naming the class, the keyword and the fix."""
    options: dict[str, Any] = {keyword: value}
    with pytest.raises(js.StructDefinitionError, match=rf"P: .*{keyword}={value}.*{fix}"):

        @js.dataclass(**options)
        class P:
            x: int


def test_mappable_error_points_at_the_porting_section_and_agrees_with_it() -> None:
    """mappable_dataclass=True names a docs section that exists, and spells keys() as it does."""
    with pytest.raises(js.StructDefinitionError) as info:

        @js.dataclass(mappable_dataclass=True)
        class P:
            x: int

    message = str(info.value)
    section = re.search(r"docs/coming-from\.md, section '([^']+)'", message)
    assert section is not None, message
    page = (Path(__file__).resolve().parents[2] / "docs" / "coming-from.md").read_text("utf-8")
    assert re.search(rf"^#+ {re.escape(section.group(1))}$", page, re.M), section.group(1)
    assert "obj.to_dict().keys()" in message
    assert (
        "| `o.keys()`, `o.values()`, `o.items()`, `list(o)`, `len(o)` | the same on `o.to_dict()` |"
        in page
    )


def test_unknown_keyword_is_refused_with_the_known_ones() -> None:
    """A misspelt keyword names itself and the keywords register_class takes."""
    with pytest.raises(js.StructDefinitionError, match=r"froze=.*frozen=True"):

        @js.dataclass(froze=True)  # type: ignore[call-overload]
        class P:
            x: int


def test_init_false_keeps_the_class_init() -> None:
    """init=False is accepted on a class with its own __init__, and refused without one."""

    @js.dataclass(init=False)
    class P:
        x: int

        def __init__(self, v: int) -> None:
            self.x = v * 2

    assert P(2).x == 4
    with pytest.raises(js.StructDefinitionError, match=r"init=False.*defines none"):

        @js.dataclass(init=False)
        class Q:
            x: int


def test_match_args_false_leaves_no_match_args() -> None:
    """match_args=False gives an empty __match_args__, as dataclasses do."""

    @js.dataclass(match_args=False)
    class P:
        x: int

    assert P.__match_args__ == ()


T = TypeVar("T")


@js.dataclass(frozen=True)
class Box(Generic[T]):
    value: T
    count: int = 1


def test_generic_class_stays_generic() -> None:
    """A Generic[T] class promoted by js.dataclass keeps its type parameters."""
    assert Box.__parameters__ == (T,)
    assert Box[int](value=3).value == 3
    assert typing.get_args(Box[int]) == (int,)


def test_subclass_of_a_parametrised_promoted_class() -> None:
    """Box[int] is a base like any generic alias; a subclass keeps Box's fields."""

    class IntBox(Box[int]):
        pass

    class AnyBox(Box[T]):
        pass

    assert IntBox(value=1).count == 1
    assert AnyBox.__parameters__ == (T,)
    assert AnyBox[str](value="s").value == "s"


def test_frozen_error_is_a_frozen_instance_error() -> None:
    """Assigning a field raises an error that `except FrozenInstanceError` catches."""
    p = Params(weights=jnp.ones(2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.weights = 1  # type: ignore[misc]
    assert issubclass(js.FrozenStructError, AttributeError)
    assert issubclass(js.FrozenStructError, js.StructError)
