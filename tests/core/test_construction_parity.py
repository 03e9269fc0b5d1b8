"""Construction habits of equinox, flax.struct and dataclasses users (issue 11, items 1-8)."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import pytest

T = TypeVar("T")


# -- 1. a custom __init__ calling super().__init__() ------------------------------------


def test_user_init_calling_super_init_without_arguments() -> None:
    """A custom __init__ may assign fields and then call super().__init__() (cooperative)."""

    class Linear(js.Struct):
        w: int

        def __init__(self, w: int) -> None:
            self.w = w
            super().__init__()

    assert Linear(3).w == 3


def test_user_init_calling_super_init_first() -> None:
    """super().__init__() may come first; the fields are assigned afterwards."""

    class Linear(js.Struct):
        w: int
        b: int = 0

        def __init__(self, w: int) -> None:
            super().__init__()
            self.w = w

    assert (Linear(3).w, Linear(3).b) == (3, 0)


def test_user_init_passing_fields_to_super_init() -> None:
    """super().__init__(w=...) from a custom __init__ assigns the given fields."""

    class Linear(js.Struct):
        w: int
        b: int = 1

        def __init__(self, w: int) -> None:
            self.b = 5
            super().__init__(w=w * 2)

    obj = Linear(3)
    assert (obj.w, obj.b) == (6, 5)


def test_cooperative_mixin_passes_arguments_through() -> None:
    """A plain mixin whose __init__ forwards *args, **kwargs to super() builds the struct."""

    class Logged:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)

    class Base(js.Struct):
        x: int

        def __init__(self, x: int) -> None:
            self.x = x

    class Both(Logged, Base):
        pass

    assert Both(4).x == 4


def test_user_init_leaving_a_field_unassigned_still_fails() -> None:
    """super().__init__() does not excuse a required field that is never assigned."""

    class Linear(js.Struct):
        w: int

        def __init__(self) -> None:
            super().__init__()

    with pytest.raises(js.ValidationError, match="'w'"):
        Linear()


def test_unassigned_field_is_a_type_error_naming_it() -> None:
    """A field no __init__ or __post_init__ assigns raises TypeError (and ValidationError)."""

    class Linear(js.Struct):
        w: int
        b: int

        def __init__(self) -> None:
            self.b = 0

    class Late(js.Struct):
        x: int
        y: int = js.field(init=False)

        def __post_init__(self) -> None:
            pass

    for make in (Linear, lambda: Late(x=1)):
        with pytest.raises(TypeError, match=r"'w'|'y'") as caught:
            make()
        assert isinstance(caught.value, js.UnassignedFieldError)
        assert isinstance(caught.value, js.ValidationError)  # older except clauses still work
        assert isinstance(caught.value, ValueError)


def test_subclass_init_calling_generated_parent_init_bare() -> None:
    """super().__init__() reaching a parent's generated __init__ keeps the assigned fields."""

    class Base(js.Struct):
        w: int
        b: int = 0

    before = Base(1)  # the parent's constructor is compiled before the subclass exists

    class Doubled(Base):
        def __init__(self, w: int) -> None:
            self.w = w * 2
            super().__init__()

    assert (Doubled(3).w, Doubled(3).b) == (6, 0)
    assert Base(2, b=5) == Base(w=2, b=5) and before.w == 1
    with pytest.raises(TypeError, match="'w'"):
        Base()  # the parent's own instances still need every required argument


def test_subclass_init_passing_arguments_to_generated_parent_init() -> None:
    """super().__init__(w, b=...) reaching a parent's generated __init__ assigns them."""

    class Base(js.Struct):
        w: int
        b: int = 0

    class Child(Base):
        def __init__(self, w: int) -> None:
            super().__init__(w, b=7)

    assert (Child(4).w, Child(4).b) == (4, 7)
    assert str(inspect.signature(Base)) == "(w: int, b: int = 0) -> None"


# -- 2. InitVar ---------------------------------------------------------------------------


class Scaled(js.Struct):
    x: float
    scale: dataclasses.InitVar[float] = 1.0

    def __post_init__(self, scale: float) -> None:
        self.x = self.x * scale


def test_initvar_reaches_post_init() -> None:
    """An InitVar argument is passed to __post_init__."""
    assert Scaled(2.0, 3.0).x == 6.0
    assert Scaled(2.0, scale=3.0).x == 6.0


def test_initvar_default_reaches_post_init() -> None:
    """An omitted InitVar passes its default."""
    assert Scaled(2.0).x == 2.0


def test_initvar_is_not_a_field() -> None:
    """An InitVar is neither stored nor a field."""
    obj = Scaled(2.0, 3.0)
    assert list(js.fields(Scaled)) == ["x"]
    assert not hasattr(obj, "scale")


def test_initvar_is_not_in_the_pytree() -> None:
    """An InitVar is no pytree leaf and survives no flatten (it was never stored)."""
    obj = Scaled(jnp.ones(2), 2.0)  # type: ignore[arg-type]
    leaves, treedef = jax.tree_util.tree_flatten(obj)
    assert len(leaves) == 1
    assert jax.tree_util.tree_unflatten(treedef, leaves) == obj


def test_initvar_is_in_the_signature() -> None:
    """The constructor signature lists the InitVar with its inner type."""
    assert str(inspect.signature(Scaled)) == "(x: float, scale: float = 1.0) -> None"
    assert str(inspect.signature(Scaled.__init__)).startswith("(self, x: float, scale: float")


def test_required_initvar() -> None:
    """An InitVar without a default is a required argument."""

    class Shifted(js.Struct):
        x: int
        by: dataclasses.InitVar[int]

        def __post_init__(self, by: int) -> None:
            self.x += by

    assert Shifted(1, 2).x == 3
    with pytest.raises(TypeError, match="by"):
        Shifted(1)  # type: ignore[call-arg]


def test_replace_forwards_initvar() -> None:
    """replace(..., initvar=...) passes the value to __post_init__."""
    assert Scaled(2.0).replace(x=1.0, scale=5.0).x == 5.0


def test_replace_uses_initvar_default() -> None:
    """replace() without the InitVar passes its default to __post_init__."""
    assert Scaled(2.0, 3.0).replace(x=1.0).x == 1.0


def test_replace_requires_initvar_without_default() -> None:
    """replace() on a class with a required InitVar says to pass it."""

    class Shifted(js.Struct):
        x: int
        by: dataclasses.InitVar[int]

        def __post_init__(self, by: int) -> None:
            self.x += by

    with pytest.raises(TypeError, match=r"InitVar 'by'.*by=\.\.\."):
        Shifted(1, 2).replace(x=0)


def test_initvar_is_inherited() -> None:
    """A subclass takes the parent's InitVar too."""

    class Child(Scaled):
        y: int = 0

    assert Child(2.0, 4.0, 1).x == 8.0


def test_initvar_as_string_annotation() -> None:
    """InitVar works with postponed (string) annotations."""
    ns: dict[str, Any] = {}
    exec(
        "from __future__ import annotations\n"
        "import dataclasses\n"
        "import jaxstruct.core as js\n"
        "class Lazy(js.Struct):\n"
        "    x: int\n"
        "    k: dataclasses.InitVar[int] = 2\n"
        "    def __post_init__(self, k):\n"
        "        self.x *= k\n",
        ns,
    )
    assert ns["Lazy"](3).x == 6
    assert list(js.fields(ns["Lazy"])) == ["x"]


# -- 4. __post_init__ looked up when an instance is built -------------------------------


def test_post_init_assigned_after_class_creation_takes_effect() -> None:
    """Assigning __post_init__ to a class later changes how instances are built."""

    class Plain(js.Struct):
        x: int

    assert Plain(1).x == 1

    def double(self: Any) -> None:
        self.x = self.x * 2

    Plain.__post_init__ = double  # type: ignore[attr-defined]
    assert Plain(1).x == 2
    assert Plain(1).replace(x=5).x == 10


def test_post_init_replaced_after_class_creation_takes_effect() -> None:
    """Replacing an existing __post_init__ takes effect on the next construction."""

    class Hooked(js.Struct):
        x: int

        def __post_init__(self) -> None:
            self.x = self.x + 1

    assert Hooked(1).x == 2

    def triple(self: Any) -> None:
        self.x = self.x * 3

    Hooked.__post_init__ = triple  # type: ignore[method-assign]
    assert Hooked(1).x == 3


def test_post_init_deleted_after_class_creation() -> None:
    """Deleting __post_init__ from the class stops it from running."""

    class Hooked(js.Struct):
        x: int

        def __post_init__(self) -> None:
            self.x = self.x + 1

    del Hooked.__post_init__
    assert Hooked(1).x == 1


def test_post_init_patched_on_parent_reaches_subclass() -> None:
    """A __post_init__ assigned to a parent is used by subclasses built afterwards."""

    class Parent(js.Struct):
        x: int

    class Child(Parent):
        y: int = 0

    assert Child(1).x == 1

    def bump(self: Any) -> None:
        self.x = self.x + 100

    Parent.__post_init__ = bump  # type: ignore[attr-defined]
    assert Child(1).x == 101


# -- 5. __init__ inherited from a plain mixin -----------------------------------------------


class Named:
    def __init__(self, x: int) -> None:
        self.x = x * 10


class Fields(js.Struct):
    x: int


def test_plain_mixin_init_is_kept_like_a_struct_parents() -> None:
    """class C(Mixin, Struct) keeps the mixin's __init__, which may assign fields."""

    class Both(Named, Fields):
        pass

    assert Both(2).x == 20


def test_plain_mixin_init_with_new_fields_is_refused_like_a_struct_parents() -> None:
    """Adding fields under a mixin's __init__ raises the same error as under a struct's."""

    class WithInit(js.Struct):
        x: int

        def __init__(self, x: int) -> None:
            self.x = x

    messages = []
    for parent in (Named, WithInit):
        with pytest.raises(js.StructDefinitionError, match="overwrite_parent_init") as info:

            class Extended(parent, Fields):  # type: ignore[valid-type, misc]
                y: int = 0

        messages.append(str(info.value).replace(parent.__qualname__, "P"))
    assert messages[0] == messages[1]


def test_plain_mixin_init_kept_with_init_false() -> None:
    """init=False keeps a plain mixin's __init__, able to assign fields."""

    class Both(Named, Fields, init=False):
        y: int = 3

    obj = Both(2)  # type: ignore[call-arg]
    assert (obj.x, obj.y) == (20, 3)


# -- 6. __orig_class__ -----------------------------------------------------------------------


class Box(js.Struct, Generic[T]):
    item: T


def test_subscripted_generic_sets_orig_class() -> None:
    """Box[int](...) records __orig_class__ as typing does for ordinary generics."""
    box = Box[int](1)
    assert box.__orig_class__ == Box[int]  # type: ignore[attr-defined]


def test_orig_class_is_not_a_field() -> None:
    """__orig_class__ is not a leaf and does not affect equality."""
    assert Box[int](1) == Box(1)
    assert jax.tree_util.tree_leaves(Box[int](1)) == [1]


def test_other_attributes_stay_frozen() -> None:
    """Only __orig_class__ may be set after construction."""
    with pytest.raises(js.FrozenStructError):
        Box(1).__orig_bases__ = ()  # type: ignore[misc]


# -- 7. annotated signature -------------------------------------------------------------------


def test_signature_shows_annotations_like_a_dataclass() -> None:
    """inspect.signature(Cls) shows annotations and -> None, as for a dataclass."""

    class A(js.Struct):
        a: int
        b: str = js.field(default="x", kw_only=True)

    @dataclasses.dataclass
    class D:
        a: int
        b: str = dataclasses.field(default="x", kw_only=True)

    # This module postpones annotations, so the dataclass shows strings; ours are resolved.
    assert str(inspect.signature(D)) == "(a: 'int', *, b: 'str' = 'x') -> None"
    assert str(inspect.signature(A)) == "(a: int, *, b: str = 'x') -> None"
    assert inspect.signature(A.__init__).return_annotation is None


def test_stub_init_signature_before_first_instance() -> None:
    """The constructor's signature is right before any instance exists."""

    class A(js.Struct):
        a: int

    sig = inspect.signature(A.__init__)
    assert list(sig.parameters) == ["self", "a"]
    assert sig.parameters["a"].annotation is int


def test_converted_field_is_annotated_with_what_the_converter_takes() -> None:
    """The constructor annotates a converted field with the converter's input type, or Any."""

    def to_int(value: str | int) -> int:
        return int(value)

    def with_self(obj: object, value: float) -> int:
        return int(value)

    class C(js.Struct):
        n: int = js.field(static=True, converter=to_int)
        v: object = js.field(converter=lambda x: x)
        m: int = js.field(converter=int, default=0)
        k: int = js.field(converter=with_self, default=0)
        plain: str = ""

    params = inspect.signature(C).parameters
    assert params["n"].annotation == str | int
    assert params["v"].annotation is Any and params["m"].annotation is Any
    assert params["k"].annotation is float
    assert params["plain"].annotation is str
    assert C.__init__.__annotations__["n"] == str | int
    assert C(n="3", v=1, k=2.5).n == 3


def test_converter_string_annotation_is_resolved_in_its_module() -> None:
    """A converter written under postponed annotations shows the evaluated type."""
    from jaxstruct.core._codegen import converter_input

    def to_int(value: str | int) -> int:
        return int(value)

    assert to_int.__annotations__["value"] == "str | int"  # this module postpones them
    assert converter_input(to_int, False) == str | int
    assert converter_input(lambda obj, v: v, True) is Any
    assert converter_input(str, False) is Any


# -- 8. bound method of self ------------------------------------------------------------------


def test_storing_a_bound_method_of_self_is_refused() -> None:
    """self.f = self.method during construction raises, naming the field and the fix."""

    class Net(js.Struct):
        act: Any = None

        def __post_init__(self) -> None:
            self.act = self.relu

        def relu(self, x: Any) -> Any:
            return x

    with pytest.raises(js.ValidationError, match=r"Net\.act.*self\.relu.*type\(self\)\.relu"):
        Net()


def test_bound_method_of_another_object_is_accepted() -> None:
    """A bound method of some other object is an ordinary value."""

    class Holder(js.Struct):
        fn: Any = js.field(static=True, default=None)

        def __init__(self, fn: Any) -> None:
            self.fn = fn

    other = [1, 2]
    assert Holder(other.count).fn(1) == 1


def test_init_annotations_are_real_from_class_creation() -> None:
    """__init__.__annotations__ and get_type_hints show the fields before any instance exists."""

    def to_int(value: str | int) -> int:
        return int(value)

    class A(js.Struct):
        a: int
        b: list[int] = js.field(default_factory=list)
        n: int = js.field(static=True, converter=to_int, default=0)

    expected = {"a": int, "b": list[int], "n": str | int, "return": None}
    assert A.__init__.__annotations__ == expected
    assert typing.get_type_hints(A.__init__) == {**expected, "return": type(None)}
    A(1)
    assert A.__init__.__annotations__ == expected


def test_init_annotations_of_a_registered_class() -> None:
    """A js.dataclass class shows its constructor's annotations and self from creation on."""

    @js.dataclass(frozen=True)
    class P:
        x: float
        tag: str = "t"

    assert P.__init__.__annotations__ == {"x": float, "tag": str, "return": None}
    assert str(inspect.signature(P.__init__)) == "(self, x: float, tag: str = 't') -> None"


def test_init_first_parameter_is_self() -> None:
    """The constructor's first parameter is named self, before and after it is compiled."""

    class A(js.Struct):
        a: int

    assert next(iter(inspect.signature(A.__init__).parameters)) == "self"
    A(1)
    assert next(iter(inspect.signature(A.__init__).parameters)) == "self"


def test_field_named_self_keeps_its_name() -> None:
    """A field named self is a parameter like any other (the instance takes another name)."""

    class A(js.Struct):
        self: int

    assert A(self=3).self == 3
    assert list(inspect.signature(A).parameters) == ["self"]
