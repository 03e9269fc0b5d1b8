"""Class-definition safety checks, inheritance, and abstract base classes."""

from __future__ import annotations

import abc

import jaxstruct.core as js
import pytest


def test_struct_definition_error_types() -> None:
    """StructDefinitionError is a StructError and a TypeError."""
    assert issubclass(js.StructDefinitionError, js.StructError)
    assert issubclass(js.StructDefinitionError, TypeError)


# -- required after defaulted --------------------------------------------------------


def test_required_after_default_is_rejected() -> None:
    """A required field after a defaulted one fails at definition."""
    with pytest.raises(js.StructDefinitionError):

        class Bad(js.Struct):
            a: int = 1
            b: int


def test_required_after_default_message_names_class_field_and_fixes() -> None:
    """The message names the class, the field, and both ways out."""
    with pytest.raises(js.StructDefinitionError) as info:

        class Bad(js.Struct):
            a: int = 1
            b: int

    message = str(info.value)
    assert "Bad" in message and "'b'" in message
    assert "default" in message and "kw_only=True" in message


def test_required_after_inherited_default_is_rejected() -> None:
    """A subclass's required field after an inherited default fails too."""

    class Base(js.Struct):
        a: int = 1

    with pytest.raises(js.StructDefinitionError, match=r"Child.*'b'"):

        class Child(Base):
            b: int


def test_required_after_default_allowed_when_default_is_kw_only() -> None:
    """A keyword-only default does not constrain later positional fields."""

    class Ok(js.Struct):
        a: int = js.field(kw_only=True, default=1)
        b: int

    assert Ok(2).b == 2


def test_required_after_init_false_default_allowed() -> None:
    """An init=False default does not constrain later fields."""

    class Ok(js.Struct):
        a: int = js.field(init=False, default=1)
        b: int

    assert Ok(2).a == 1


# -- derived node, default+factory ---------------------------------------------------


def test_derived_node_field_names_class_field_and_fixes() -> None:
    """A derived node field fails naming class, field, static=True and pytree=False."""
    with pytest.raises(js.StructDefinitionError) as info:

        class Bad(js.Struct):
            x: int
            y: int = js.field(init=False, derived=lambda self: self.x)

    message = str(info.value)
    assert "Bad" in message and "'y'" in message
    assert "static=True" in message and "pytree=False" in message


def test_default_with_factory_names_class_field_and_fixes() -> None:
    """default with default_factory fails naming class, field and both options."""
    with pytest.raises(js.StructDefinitionError) as info:

        class Bad(js.Struct):
            x: int = js.field(default=0, default_factory=int)

    message = str(info.value)
    assert "Bad" in message and "'x'" in message
    assert "default=" in message and "default_factory=" in message


# -- shadowing -----------------------------------------------------------------------


class Base(js.Struct):
    lr: float = js.field(static=True, default=0.1)
    x: int = 0


def test_redeclared_inherited_field_is_rejected() -> None:
    """Re-annotating an inherited field fails, naming class, field, parent and both fixes."""
    with pytest.raises(js.StructDefinitionError) as info:

        class Child(Base):
            lr: float = 0.2

    message = str(info.value)
    assert "Child" in message and "'lr'" in message and "Base" in message
    assert "drop the annotation" in message and "override=True" in message


def test_plain_class_attribute_shadowing_inherited_field_is_rejected() -> None:
    """An unannotated class attribute with an inherited field's name fails with both fixes."""
    with pytest.raises(js.StructDefinitionError) as info:

        class Child(Base):
            lr = 0.5

    message = str(info.value)
    assert "Child" in message and "'lr'" in message
    assert "override=True" in message and "rename" in message


def test_method_shadowing_inherited_field_is_rejected() -> None:
    """A method named like an inherited field would hide it and fails."""
    with pytest.raises(js.StructDefinitionError, match=r"Child.*'x'"):

        class Child(Base):
            def x(self) -> int:
                return 1


def test_override_true_replaces_inherited_field() -> None:
    """override=True redeclares an inherited field deliberately, keeping its position."""

    class Child(Base):
        lr: float = js.field(static=True, default=0.5, override=True)

    assert Child().lr == 0.5 and list(Child.fields()) == ["lr", "x"]


def test_override_without_parent_field_is_rejected() -> None:
    """override=True on a field no parent declares fails."""
    with pytest.raises(js.StructDefinitionError, match=r"Bad.*'y'.*override"):

        class Bad(Base):
            y: int = js.field(default=0, override=True)


def test_reserved_method_name_as_field_is_rejected() -> None:
    """A field named like a Struct method (replace) fails at definition."""
    with pytest.raises(js.StructDefinitionError, match=r"Bad.*'replace'"):

        class Bad(js.Struct):
            replace: int = 0  # type: ignore[assignment]


# -- parent custom __init__ ----------------------------------------------------------


class Legacy:
    def __init__(self, q: int) -> None:
        self.q = q


def test_parent_custom_init_overwrite_is_rejected() -> None:
    """Generating __init__ over an inherited custom one fails naming the class and the ways out."""
    with pytest.raises(js.StructDefinitionError) as info:

        class Bad(Legacy, js.Struct):
            a: int = 1

    message = str(info.value)
    assert "Bad" in message and "Legacy" in message
    assert "init=False" in message and "overwrite_parent_init=True" in message


def test_struct_parent_user_init_overwrite_is_rejected() -> None:
    """A subclass adding fields under a struct parent with a user __init__ fails."""

    class Parent(js.Struct):
        a: int = 1

        def __init__(self) -> None:
            self.a = 3

    with pytest.raises(js.StructDefinitionError, match=r"Child.*Parent"):

        class Child(Parent):
            b: int = 2


def test_overwrite_parent_init_true_generates_init() -> None:
    """overwrite_parent_init=True replaces the parent's __init__ deliberately."""

    class Ok(Legacy, js.Struct, overwrite_parent_init=True):
        a: int = 1

    assert Ok(a=5).a == 5


def test_init_false_keeps_parent_init() -> None:
    """init=False keeps the inherited custom __init__."""

    class Parent(js.Struct):
        a: int = 1

        def __init__(self, v: int) -> None:
            self.a = v

    class Child(Parent, init=False):
        b: int = 2

    c = Child(7)
    assert (c.a, c.b) == (7, 2)


def test_defining_init_in_class_body_is_allowed() -> None:
    """Defining __init__ in the subclass itself is the third way out."""

    class Ok(Legacy, js.Struct):
        a: int = 1

        def __init__(self, a: int) -> None:
            self.a = a

    assert Ok(4).a == 4


# -- abstract classes and metaclasses ------------------------------------------------


def test_struct_with_abc_has_no_metaclass_conflict() -> None:
    """class X(Struct, abc.ABC) is accepted."""

    class WithABC(js.Struct, abc.ABC):
        x: int = 0

    assert WithABC().x == 0


def test_abc_first_in_bases_also_works() -> None:
    """class X(abc.ABC, Struct) is accepted."""

    class WithABC(abc.ABC, js.Struct):
        x: int = 0

    assert WithABC(x=1).x == 1


def test_abstractmethod_enforced_with_abc() -> None:
    """A struct with an abstract method cannot be instantiated (with abc.ABC)."""

    class Solver(js.Struct, abc.ABC):
        lr: float = js.field(static=True, default=0.1)

        @abc.abstractmethod
        def step(self) -> float: ...

    with pytest.raises(TypeError, match="abstract"):
        Solver()  # type: ignore[abstract]


def test_abstractmethod_enforced_on_plain_struct() -> None:
    """@abstractmethod on a plain Struct subclass is enforced, not silently ignored."""

    class Solver(js.Struct):
        lr: float = js.field(static=True, default=0.1)

        @abc.abstractmethod
        def step(self) -> float: ...

    with pytest.raises(TypeError, match="abstract"):
        Solver()


def test_concrete_subclass_of_abstract_struct() -> None:
    """A subclass implementing every abstract method can be instantiated."""

    class Solver(js.Struct, abc.ABC):
        lr: float = js.field(static=True, default=0.1)

        @abc.abstractmethod
        def step(self) -> float: ...

    class SGD(Solver):
        def step(self) -> float:
            return self.lr

    assert SGD().step() == 0.1


def test_incomplete_subclass_still_abstract() -> None:
    """A subclass that leaves an abstract method unimplemented cannot be instantiated."""

    class Solver(js.Struct):
        @abc.abstractmethod
        def step(self) -> float: ...

        @abc.abstractmethod
        def reset(self) -> None: ...

    class Half(Solver):
        def step(self) -> float:
            return 0.0

    with pytest.raises(TypeError, match="reset"):
        Half()  # type: ignore[abstract]


def test_struct_meta_is_an_abc_meta() -> None:
    """StructMeta derives from ABCMeta (which is why abc.ABC mixes in)."""
    assert issubclass(js.StructMeta, abc.ABCMeta)
    assert isinstance(js.Struct, js.StructMeta)


def test_subclass_of_struct_metaclass_works() -> None:
    """A metaclass derived from StructMeta can be used for struct classes."""

    class Meta(js.StructMeta):
        pass

    class P(js.Struct, metaclass=Meta):
        x: int = 0

    assert type(P) is Meta and P(x=1).x == 1


def test_struct_base_takes_no_arguments() -> None:
    """Struct itself declares no fields."""
    with pytest.raises(TypeError):
        js.Struct(1)  # type: ignore[call-arg]


def test_subclass_adds_fields_after_parent() -> None:
    """Subclass construction takes parent fields then its own."""

    class Child(Base):
        y: int = 5

    c = Child(0.3, 1, 2)
    assert (c.lr, c.x, c.y) == (0.3, 1, 2)


def test_class_keywords_are_checked() -> None:
    """An unknown class keyword is an error, not silently ignored."""
    with pytest.raises(TypeError):

        class Bad(js.Struct, nonsense=True):  # type: ignore[call-arg]
            x: int = 0
