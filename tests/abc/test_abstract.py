"""Abstract structs: StructABCMeta, AbstractVar, AbstractClassVar and abstract=True."""

from __future__ import annotations

import abc
from typing import ClassVar

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import pytest
from jaxstruct.abc import AbstractClassVar, AbstractVar, StructABCMeta, is_abstract


class AbstractSolver(js.Struct, metaclass=StructABCMeta):
    lr: float = js.field(static=True)

    @abc.abstractmethod
    def step(self, params): ...


class SGD(AbstractSolver):
    def step(self, params):
        return jax.tree_util.tree_map(lambda p: p - self.lr, params)


class AbstractModel(js.Struct, metaclass=StructABCMeta):
    weights: object
    name: AbstractVar[str]
    kind: AbstractClassVar[str]


class Model(AbstractModel):
    name: str = js.field(static=True, default="m")
    kind: ClassVar[str] = "dense"


def test_abstract_struct_cannot_be_instantiated():
    """An abstract struct raises TypeError naming the abstract method."""
    with pytest.raises(TypeError, match=r"abstract struct AbstractSolver: abstract method 'step'"):
        AbstractSolver(lr=0.1)


def test_missing_abstract_method_raises_at_instantiation():
    """A subclass missing an abstract method raises TypeError on instantiation, like an ABC."""

    class Lazy(AbstractSolver):
        pass

    with pytest.raises(TypeError, match="step"):
        Lazy(lr=0.1)


def test_complete_subclass_is_a_frozen_pytree():
    """A complete subclass is a normal frozen pytree with the static field in the treedef."""
    sgd = SGD(lr=0.5)
    assert sgd.step(jnp.ones(2)).tolist() == [0.5, 0.5]
    assert jax.tree_util.tree_leaves(sgd) == []
    with pytest.raises(js.FrozenStructError):
        sgd.lr = 1.0  # type: ignore[misc]


def test_abstract_vars_are_not_fields():
    """AbstractVar and AbstractClassVar declarations never become fields."""
    assert list(js.fields(AbstractModel)) == ["weights"]


def test_provided_abstract_var_is_a_field():
    """A concrete subclass providing an AbstractVar as a field gets it in the constructor."""
    m = Model(weights=jnp.ones(1), name="x")
    assert list(js.fields(Model)) == ["weights", "name"]
    assert (m.name, Model.kind) == ("x", "dense")


def test_abstract_vars_stay_out_of_the_pytree():
    """Only real node fields are leaves; abstract declarations add nothing."""
    m = Model(weights=jnp.ones(1))
    assert len(jax.tree_util.tree_leaves(m)) == 1


def test_class_with_pending_abstract_vars_cannot_be_instantiated():
    """The abstract base names its missing AbstractVar and AbstractClassVar."""
    with pytest.raises(TypeError, match="AbstractVar 'name' and AbstractClassVar 'kind'"):
        AbstractModel(weights=1)


def test_concrete_class_missing_abstract_var_fails_at_definition():
    """A concrete subclass that forgets an AbstractVar fails when defined, naming the field."""
    with pytest.raises(
        js.StructDefinitionError, match=r"'name' \(AbstractVar, declared by AbstractModel\)"
    ):

        class Forgot(AbstractModel):
            kind: ClassVar[str] = "k"


def test_rejected_concrete_class_is_not_left_registered():
    """A class rejected for a missing AbstractVar never reaches JAX or the class registry."""
    before = set(type.__subclasses__(AbstractModel))
    with pytest.raises(js.StructDefinitionError) as info:  # its traceback keeps the class alive

        class Forgot(AbstractModel):
            kind: ClassVar[str] = "k"

    (rejected,) = set(type.__subclasses__(AbstractModel)) - before
    assert rejected.__name__ == "Forgot" and info.value
    assert not js.is_registered_pytree_type(rejected)
    stray = object.__new__(rejected)
    assert jax.tree_util.tree_leaves(stray) == [stray]


def test_concrete_class_missing_abstract_class_var_fails_at_definition():
    """A concrete subclass that forgets an AbstractClassVar fails when defined, naming it."""
    with pytest.raises(js.StructDefinitionError, match=r"'kind' \(AbstractClassVar"):

        class Forgot(AbstractModel):
            name: str = "n"


def test_definition_error_explains_both_fixes():
    """The definition error shows the right declaration and the abstract=True way out."""
    with pytest.raises(js.StructDefinitionError, match="abstract=True") as info:

        class Forgot(AbstractModel):
            pass

    assert "kind: ClassVar[str] = " in str(info.value)


def test_abstract_keyword_defers_the_check():
    """abstract=True lets an intermediate class leave abstract vars to its subclasses."""

    class Partial(AbstractModel, abstract=True):
        kind: ClassVar[str] = "p"

    class Done(Partial):
        name: str = "d"

    assert is_abstract(Partial)
    assert Done(weights=1).name == "d"


def test_abstract_keyword_is_not_inherited():
    """A subclass of an abstract=True class is concrete again and checked."""

    class Partial(AbstractModel, abstract=True):
        kind: ClassVar[str] = "p"

    with pytest.raises(js.StructDefinitionError, match="'name'"):

        class StillMissing(Partial):
            pass


def test_abstract_keyword_requires_a_bool():
    """abstract= with a non-bool value is a definition error."""
    with pytest.raises(js.StructDefinitionError, match="expects True or False"):

        class Odd(js.Struct, abstract="yes"):  # type: ignore[call-arg]
            x: int


def test_property_provides_an_abstract_var():
    """A property satisfies an AbstractVar."""

    class ByProperty(AbstractModel):
        kind: ClassVar[str] = "k"

        @property
        def name(self) -> str:
            return "prop"

    assert ByProperty(weights=1).name == "prop"


def test_field_cannot_provide_an_abstract_class_var():
    """An AbstractClassVar provided as an instance field is a definition error."""
    with pytest.raises(js.StructDefinitionError, match="must be a class attribute"):

        class Wrong(AbstractModel):
            name: str = "n"
            kind: str = "k"


def test_abstract_declaration_with_value_is_rejected():
    """An AbstractVar given a value in the same body is a definition error."""
    with pytest.raises(js.StructDefinitionError, match="also given a value"):

        class Valued(js.Struct):
            x: AbstractVar[int] = 3  # type: ignore[assignment]


def test_bare_marker_is_rejected():
    """A bare AbstractVar without a type is a definition error saying how to fix it."""
    with pytest.raises(js.StructDefinitionError, match=r"bare AbstractVar.*AbstractVar\[int\]"):

        class Bare(js.Struct):
            x: AbstractVar  # type: ignore[type-arg]


def test_string_annotations_are_understood():
    """With postponed annotations the markers are still recognised (this module uses them)."""
    assert isinstance(AbstractModel.__annotations__["name"], str)
    assert AbstractModel.__abstractvars__ == frozenset({"name"})


def test_plain_struct_base_supports_abstract_vars():
    """AbstractVar works on a Struct without StructABCMeta too."""

    class Base(js.Struct):
        size: AbstractVar[int]

    class Impl(Base):
        size: int = 2

    with pytest.raises(TypeError, match="size"):
        Base()
    assert Impl().size == 2


def test_abc_mixin_works():
    """A plain abc.ABC mixin combines with Struct and StructABCMeta without conflict."""

    class Runner(abc.ABC):
        @abc.abstractmethod
        def run(self) -> int: ...

    class Base(js.Struct, Runner, metaclass=StructABCMeta):
        x: int

    class Impl(Base):
        def run(self) -> int:
            return self.x

    with pytest.raises(TypeError, match="run"):
        Base(x=1)
    assert Impl(x=3).run() == 3


def test_non_struct_mixin_declares_abstract_vars():
    """A plain mixin's AbstractVar must be provided by the struct using it."""

    class Named:
        label: AbstractVar[str]

    with pytest.raises(js.StructDefinitionError, match="'label'"):

        class Missing(js.Struct, Named):
            x: int

    class Present(js.Struct, Named):
        label: str

    assert Present(label="a").label == "a"


def test_register_class_provides_abstract_vars():
    """register_class on a class inheriting an AbstractVar mixin checks and accepts the field."""

    class Named:
        label: AbstractVar[str]

    @js.register_class
    class Tagged(Named):
        label: str = "t"

    assert Tagged().label == "t"


def test_register_class_rejects_missing_abstract_var():
    """register_class on a class forgetting an inherited AbstractVar fails naming it."""

    class Named:
        label: AbstractVar[str]

    with pytest.raises(js.StructDefinitionError, match="'label'"):

        @js.register_class
        class Untagged(Named):
            x: int = 0


def test_is_abstract_reports_abstract_vars():
    """is_abstract is True while abstract methods or vars are left, False once provided."""
    assert is_abstract(AbstractModel) and is_abstract(AbstractSolver)
    assert not is_abstract(Model) and not is_abstract(SGD)
