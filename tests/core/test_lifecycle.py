"""Construction lifecycle, immutability, replace, and user-written __init__."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import pytest


def _recording_class(log: list[str]) -> type:
    def conv(value: int) -> int:
        log.append("convert")
        return value

    def derive(self: object) -> int:
        log.append("derived")
        return 0

    def validate(value: int) -> bool:
        log.append("validate")
        return True

    class Rec(js.Struct):
        x: int = js.field(converter=conv, validator=validate)
        d: int = js.field(static=True, init=False, derived=derive)

        def __post_init__(self) -> None:
            log.append("post_init")

    return Rec


# -- lifecycle order -----------------------------------------------------------------


def test_lifecycle_runs_in_documented_order() -> None:
    """Construction runs convert, derived, __post_init__, derived, validate, in that order."""
    log: list[str] = []
    _recording_class(log)(1)
    assert log == ["convert", "derived", "post_init", "derived", "validate"]


def test_post_init_may_assign_fields() -> None:
    """__post_init__ runs before freezing and may assign fields."""

    class Model(js.Struct):
        x: int

        def __post_init__(self) -> None:
            self.x = self.x + 1

    assert Model(x=2).x == 3


def test_post_init_assignment_goes_through_converter() -> None:
    """An assignment in __post_init__ is converted like a constructor value."""

    class P(js.Struct):
        x: int = js.field(converter=int)

        def __post_init__(self) -> None:
            self.x = "9"  # type: ignore[assignment]

    assert P(1).x == 9


def test_validators_see_post_init_values() -> None:
    """Validators run after __post_init__, on its results."""

    class P(js.Struct):
        x: int = js.field(validator=lambda v: v > 0)

        def __post_init__(self) -> None:
            self.x = -self.x

    with pytest.raises(js.ValidationError):
        P(1)


def test_post_init_assigning_an_undeclared_name_is_an_error() -> None:
    """__post_init__ cannot add attributes that are not fields; the error names the fix."""

    class P(js.Struct):
        x: int

        def __post_init__(self) -> None:
            self.extra = 1

    with pytest.raises(js.FrozenStructError, match=r"'extra'.*field\("):
        P(1)


def test_instance_is_frozen_after_post_init() -> None:
    """The instance freezes once construction completes."""

    class P(js.Struct):
        x: int

        def __post_init__(self) -> None:
            self.x = 2

    with pytest.raises(js.FrozenStructError):
        P(1).x = 3  # type: ignore[misc]


def test_post_init_is_inherited() -> None:
    """A subclass runs the __post_init__ it inherits."""

    class Base(js.Struct):
        x: int

        def __post_init__(self) -> None:
            self.x = self.x * 10

    class Child(Base):
        y: int = 0

    assert Child(1).x == 10


# -- frozen --------------------------------------------------------------------------


class Point(js.Struct):
    x: int
    y: int = 0


def test_setattr_raises_frozen_struct_error() -> None:
    """Assigning a field of a constructed instance raises FrozenStructError."""
    with pytest.raises(js.FrozenStructError, match=r"'x'.*replace"):
        Point(1).x = 2  # type: ignore[misc]


def test_setattr_of_new_attribute_raises() -> None:
    """Assigning a new attribute raises FrozenStructError too."""
    with pytest.raises(js.FrozenStructError):
        Point(1).z = 2  # type: ignore[attr-defined]


def test_delattr_raises_frozen_struct_error() -> None:
    """Deleting a field raises FrozenStructError."""
    with pytest.raises(js.FrozenStructError, match="'x'"):
        del Point(1).x  # type: ignore[misc]


def test_frozen_struct_error_is_an_attribute_error() -> None:
    """FrozenStructError is an AttributeError (and a StructError)."""
    assert issubclass(js.FrozenStructError, AttributeError)
    assert issubclass(js.FrozenStructError, js.StructError)


def test_frozen_error_caught_as_attribute_error() -> None:
    """Code catching AttributeError catches assignment to a frozen struct."""
    with pytest.raises(AttributeError):
        Point(1).x = 2  # type: ignore[misc]


def test_failed_setattr_leaves_value_unchanged() -> None:
    """A rejected assignment does not change the field."""
    p = Point(1)
    with pytest.raises(js.FrozenStructError):
        p.x = 5  # type: ignore[misc]
    assert p.x == 1


def test_instance_without_hooks_is_frozen() -> None:
    """A class without hooks is frozen as well."""

    class Plain(js.Struct):
        a: int

    with pytest.raises(js.FrozenStructError):
        Plain(1).a = 2  # type: ignore[misc]


def test_unflattened_instance_is_frozen() -> None:
    """An instance rebuilt by tree_map is frozen."""
    p = jax.tree_util.tree_map(lambda v: v, Point(1))
    with pytest.raises(js.FrozenStructError):
        p.x = 2  # type: ignore[misc]


# -- replace -------------------------------------------------------------------------


def test_replace_returns_new_instance_with_change() -> None:
    """replace() returns a new instance with the field changed."""
    p = Point(1, 2)
    q = p.replace(x=5)
    assert q == Point(5, 2) and q is not p


def test_replace_leaves_original_unchanged() -> None:
    """replace() never modifies the original."""
    p = Point(1, 2)
    p.replace(x=5)
    assert p == Point(1, 2)


def test_replace_keeps_other_values_by_identity() -> None:
    """Unchanged fields carry the very same objects."""

    class P(js.Struct):
        a: object
        b: object

    arr = jnp.ones(3)
    assert P(arr, 1).replace(b=2).a is arr


def test_replace_unknown_field_raises_type_error() -> None:
    """replace() with an unknown name raises TypeError naming it."""
    with pytest.raises(TypeError, match="'z'"):
        Point(1).replace(z=3)


def test_replace_runs_post_init() -> None:
    """replace() runs __post_init__ again."""
    calls: list[int] = []

    class P(js.Struct):
        x: int

        def __post_init__(self) -> None:
            calls.append(self.x)

    P(1).replace(x=2)
    assert calls == [1, 2]


def test_replace_runs_full_lifecycle_in_order() -> None:
    """replace() runs convert, derived, __post_init__, derived, validate."""
    log: list[str] = []
    rec = _recording_class(log)(1)
    log.clear()
    rec.replace(x=2)
    assert log == ["convert", "derived", "post_init", "derived", "validate"]


def test_replace_result_is_frozen() -> None:
    """The instance replace() returns is frozen."""
    with pytest.raises(js.FrozenStructError):
        Point(1).replace(x=2).x = 3  # type: ignore[misc]


def test_replace_with_no_changes_gives_equal_copy() -> None:
    """replace() without arguments returns an equal instance."""
    p = Point(1, 2)
    assert p.replace() == p


def test_replace_init_false_field() -> None:
    """replace() may set an init=False (non-derived) field."""

    class P(js.Struct):
        x: int
        y: int = js.field(init=False, default=0)

    assert P(1).replace(y=5).y == 5


def test_replace_flattens_to_new_values() -> None:
    """After replace(), JAX sees the new node and static values."""

    class P(js.Struct):
        x: object
        n: int = js.field(static=True, default=1)

    q = P(1.0).replace(x=2.0, n=3)
    leaves, tree = jax.tree_util.tree_flatten(q)
    assert leaves == [2.0]
    assert jax.tree_util.tree_unflatten(tree, leaves).n == 3


# -- user-written __init__ -----------------------------------------------------------


class Custom(js.Struct):
    x: int = js.field(converter=int, validator=lambda v: v >= 0)
    y: int = 0
    twice: int = js.field(static=True, init=False, derived=lambda self: self.x * 2)
    calls = 0  # a plain class attribute (no annotation), not a field

    def __init__(self, value: int) -> None:
        type(self).calls += 1
        self.x = value
        self.y = self.x + 1


def test_user_init_may_assign_fields() -> None:
    """A user-written __init__ assigns fields with self.x = ..."""
    c = Custom(3)
    assert (c.x, c.y) == (3, 4)


def test_user_init_instance_is_frozen_afterwards() -> None:
    """After a user-written __init__ the instance is frozen."""
    with pytest.raises(js.FrozenStructError):
        Custom(3).x = 1  # type: ignore[misc]


def test_user_init_assignments_are_converted() -> None:
    """Assignments in a user-written __init__ go through converters."""
    assert Custom("4").x == 4  # type: ignore[arg-type]


def test_user_init_runs_validators() -> None:
    """Validators run after a user-written __init__."""
    with pytest.raises(js.ValidationError, match=r"Custom\.x"):
        Custom(-1)


def test_user_init_computes_derived_fields() -> None:
    """Derived fields are computed after a user-written __init__."""
    assert Custom(3).twice == 6


def test_user_init_defaults_are_preassigned() -> None:
    """Fields with defaults have their default before the user's __init__ runs."""

    class P(js.Struct):
        x: int
        y: int = 7

        def __init__(self, x: int) -> None:
            self.x = x + self.y

    assert P(1).x == 8


def test_user_init_missing_field_is_a_validation_error() -> None:
    """A user-written __init__ that leaves a required field unset fails naming it."""

    class P(js.Struct):
        x: int
        y: int

        def __init__(self, a: int) -> None:
            self.x = a

    with pytest.raises(js.ValidationError, match=r"P.*'y'"):
        P(1)


def test_user_init_runs_post_init_afterwards() -> None:
    """__post_init__ runs after a user-written __init__."""
    log: list[str] = []

    class P(js.Struct):
        x: int

        def __init__(self, a: int) -> None:
            log.append("init")
            self.x = a

        def __post_init__(self) -> None:
            log.append("post_init")

    P(1)
    assert log == ["init", "post_init"]


def test_replace_on_user_init_class_does_not_rerun_init() -> None:
    """replace() on a class with a user __init__ sets fields without calling it."""
    c = Custom(3)
    before = Custom.calls
    d = c.replace(y=10)
    assert Custom.calls == before
    assert (d.x, d.y) == (3, 10)


def test_replace_on_user_init_class_runs_converters_derived_validators() -> None:
    """replace() on such a class converts, rederives and validates."""
    c = Custom(3)
    assert c.replace(x="5").twice == 10  # type: ignore[arg-type]
    with pytest.raises(js.ValidationError):
        c.replace(x=-2)


def test_user_init_calling_generated_parent_init() -> None:
    """A subclass __init__ may call super().__init__ of a generated constructor."""

    class Parent(js.Struct):
        x: int
        y: int = 0

    class Child(Parent):
        z: int = 5

        def __init__(self, v: int) -> None:
            super().__init__(x=v)
            self.z = v * 10

    c = Child(2)
    assert (c.x, c.y, c.z) == (2, 0, 20)
    with pytest.raises(js.FrozenStructError):
        c.z = 1  # type: ignore[misc]


def test_user_init_inherited_by_subclass_without_fields() -> None:
    """A subclass adding no fields keeps the parent's user-written __init__."""

    class Sub(Custom):
        pass

    assert Sub(2).y == 3


def test_user_init_unflatten_does_not_call_init() -> None:
    """tree_map rebuilds a user-init class without calling its __init__."""
    c = Custom(3)
    before = Custom.calls
    jax.tree_util.tree_map(lambda v: v, c)
    assert Custom.calls == before


# -- build ---------------------------------------------------------------------------


def test_build_skips_init_and_post_init() -> None:
    """js.build creates an instance from values without __init__ or __post_init__."""
    calls: list[int] = []

    class P(js.Struct):
        x: int = js.field(converter=int)
        y: int = 0

        def __post_init__(self) -> None:
            calls.append(1)

    p = js.build(P, {"x": "3"})
    assert (p.x, p.y, calls) == (3, 0, [])


def test_build_unknown_field_is_a_validation_error() -> None:
    """js.build rejects an unknown field name."""
    with pytest.raises(js.ValidationError, match="'z'"):
        js.build(Point, {"x": 1, "z": 2})
