"""Converters, validators and derived fields."""

from __future__ import annotations

import math

import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest

# -- converters ----------------------------------------------------------------------


class Box(js.Struct):
    count: int = js.field(converter=int)
    label: str = js.field(converter=str.strip, default="")


def _clamp(self: Bounded, value: int) -> int:
    return max(0, min(value, self.maximum))


class Bounded(js.Struct):
    maximum: int
    value: int = js.field(converter=_clamp)


def test_converter_int_coerces_a_string() -> None:
    """converter=int turns "3" into 3."""
    box = Box(count="3")  # type: ignore[arg-type]
    assert box.count == 3 and type(box.count) is int


def test_converter_int_accepts_an_int() -> None:
    """converter=int works with int input (arity is never decided by trial calls)."""
    assert Box(count=4).count == 4


def test_converter_str_strip_is_one_argument() -> None:
    """converter=str.strip (optional second parameter) is called with the value only."""
    assert Box(count=1, label="  hello ").label == "hello"


def test_converter_jnp_asarray() -> None:
    """converter=jnp.asarray turns a list into a JAX array."""

    class P(js.Struct):
        x: object = js.field(converter=jnp.asarray)

    p = P([1.0, 2.0])
    assert isinstance(p.x, jnp.ndarray) and p.x.shape == (2,)


def test_converter_np_asarray_with_dtype_default() -> None:
    """A converter with extra optional parameters is still the one-argument form."""

    class P(js.Struct):
        x: object = js.field(converter=np.asarray)

    assert isinstance(P([1, 2]).x, np.ndarray)


def test_two_argument_converter_receives_self() -> None:
    """A (self, value) converter sees already-assigned fields."""
    assert Bounded(maximum=5, value=10).value == 5
    assert Bounded(maximum=5, value=-3).value == 0


def test_two_argument_lambda_converter() -> None:
    """A two-parameter lambda is called as converter(self, value)."""

    class P(js.Struct):
        scale: int
        x: int = js.field(converter=lambda self, v: v * self.scale)

    assert P(3, 2).x == 6


def test_converter_with_only_optional_parameters_is_one_argument() -> None:
    """A converter whose second parameter has a default is the one-argument form."""

    class P(js.Struct):
        x: int = js.field(converter=lambda v, k=10: v * k)

    assert P(2).x == 20


def test_converter_is_never_called_to_probe_its_arity() -> None:
    """The converter is called exactly once per assignment."""
    calls: list[object] = []

    def conv(value: int) -> int:
        calls.append(value)
        return value

    class P(js.Struct):
        x: int = js.field(converter=conv)

    P(1)
    assert calls == [1]


def test_converter_runs_on_default() -> None:
    """A default value goes through the converter too."""

    class P(js.Struct):
        x: str = js.field(converter=str.upper, default="abc")

    assert P().x == "ABC"


def test_converter_runs_on_replace() -> None:
    """replace() passes the new value through the converter."""
    assert Box(count=1).replace(count="7").count == 7  # type: ignore[arg-type]


def test_converter_error_propagates() -> None:
    """An exception raised by a converter reaches the caller unchanged."""
    with pytest.raises(ValueError, match="invalid literal"):
        Box(count="x")  # type: ignore[arg-type]


def test_non_callable_converter_is_a_definition_error() -> None:
    """converter= must be callable; the class definition fails naming class and field."""
    with pytest.raises(js.StructDefinitionError, match=r"Bad.*'x'"):

        class Bad(js.Struct):
            x: int = js.field(converter=3)  # type: ignore[arg-type]


# -- validators ----------------------------------------------------------------------


def _positive(value: float) -> bool:
    return value > 0


def _finite(value: float) -> bool:
    return math.isfinite(value)


class Rate(js.Struct):
    lr: float = js.field(validator=_positive)


def test_validator_accepts_a_good_value() -> None:
    """A validator returning True lets construction proceed."""
    assert Rate(lr=0.01).lr == 0.01


def test_validator_returning_false_raises_validation_error() -> None:
    """A validator returning False raises ValidationError."""
    with pytest.raises(js.ValidationError):
        Rate(lr=-1.0)


def test_validation_error_names_class_and_field() -> None:
    """The ValidationError message names the class and the field."""
    with pytest.raises(js.ValidationError, match=r"Rate\.lr"):
        Rate(lr=-1.0)


def test_validation_error_is_a_value_error_and_struct_error() -> None:
    """ValidationError is both a StructError and a ValueError."""
    assert issubclass(js.ValidationError, js.StructError)
    assert issubclass(js.ValidationError, ValueError)


def test_validator_returning_none_accepts() -> None:
    """A validator returning None (checking by raising) accepts the value."""

    class P(js.Struct):
        x: int = js.field(validator=lambda v: None)

    assert P(1).x == 1


def test_validator_raising_propagates() -> None:
    """An exception raised inside a validator propagates as is."""

    def check(value: int) -> bool:
        raise KeyError("boom")

    class P(js.Struct):
        x: int = js.field(validator=check)

    with pytest.raises(KeyError, match="boom"):
        P(1)


def test_validator_list_runs_in_order() -> None:
    """A list of validators runs in order."""
    calls: list[str] = []

    def a(v: float) -> bool:
        calls.append("a")
        return True

    def b(v: float) -> bool:
        calls.append("b")
        return True

    class P(js.Struct):
        x: float = js.field(validator=[a, b])

    P(1.0)
    assert calls == ["a", "b"]


def test_validator_list_stops_at_first_failure() -> None:
    """The first failing validator of a list raises; later ones do not run."""

    class P(js.Struct):
        lr: float = js.field(validator=[_positive, _finite])

    assert P(1.0).lr == 1.0
    with pytest.raises(js.ValidationError, match="_positive"):
        P(-math.inf)
    with pytest.raises(js.ValidationError, match="_finite"):
        P(math.inf)


def test_two_argument_validator_receives_self() -> None:
    """A (self, value) validator can compare against other fields."""

    class Range(js.Struct):
        lo: int
        hi: int = js.field(validator=lambda self, v: v >= self.lo)

    assert Range(1, 2).hi == 2
    with pytest.raises(js.ValidationError, match=r"Range\.hi"):
        Range(3, 2)


def test_validator_sees_converted_value() -> None:
    """The validator is called after the converter, with the converted value."""
    seen: list[object] = []

    class P(js.Struct):
        x: int = js.field(converter=int, validator=lambda v: seen.append(v) or True)

    P("5")  # type: ignore[arg-type]
    assert seen == [5]


def test_validator_runs_on_replace() -> None:
    """replace() validates the new value."""
    with pytest.raises(js.ValidationError):
        Rate(lr=1.0).replace(lr=-1.0)


def test_validator_on_array_value_checks_all_elements() -> None:
    """A validator returning a boolean array rejects when any element is False."""

    class P(js.Struct):
        x: object = js.field(validator=lambda v: v > 0)

    assert P(jnp.ones(3)).x.shape == (3,)
    with pytest.raises(js.ValidationError, match="float32\\[2\\]"):
        P(jnp.array([1.0, -1.0]))


def test_non_callable_validator_is_a_definition_error() -> None:
    """Every validator must be callable; the definition fails naming class and field."""
    with pytest.raises(js.StructDefinitionError, match=r"Bad.*'x'"):

        class Bad(js.Struct):
            x: int = js.field(validator=[_positive, 3])  # type: ignore[list-item]


def test_static_field_array_is_rejected() -> None:
    """A static field holding an array raises ValidationError naming class and field."""

    class P(js.Struct):
        s: object = js.field(static=True)

    with pytest.raises(js.ValidationError, match=r"P\.s.*array"):
        P(jnp.ones(2))


def test_static_field_unhashable_is_rejected() -> None:
    """A static field holding an unhashable value raises ValidationError with the fix."""

    class P(js.Struct):
        s: object = js.field(static=True)

    with pytest.raises(js.ValidationError, match=r"P\.s.*hashable.*tuple"):
        P([1, 2])


@pytest.mark.parametrize("annotation", [int, "int", str, bool, float])
def test_static_check_ignores_the_annotation(annotation: object) -> None:
    """An annotation naming a plain type does not exempt a wrong value from the check."""

    class P(js.Struct):
        __annotations__ = {"s": annotation}
        s = js.field(static=True, default=0)

    assert P(s=1).s == 1 and P(s="x").s == "x" and P(s=True).s is True
    with pytest.raises(js.ValidationError, match=r"P\.s.*array"):
        P(s=jnp.ones(2))  # type: ignore[arg-type]
    with pytest.raises(js.ValidationError, match=r"P\.s.*hashable"):
        P().replace(s=[1])  # type: ignore[arg-type]


def test_static_field_check_runs_on_replace() -> None:
    """replace() rejects an unhashable static value too."""

    class P(js.Struct):
        s: object = js.field(static=True, default=())

    with pytest.raises(js.ValidationError, match=r"P\.s"):
        P().replace(s=[1])


# -- derived fields ------------------------------------------------------------------


class Dataset(js.Struct):
    samples: list
    n: int = js.field(static=True, init=False, derived=lambda self: len(self.samples))


def test_derived_field_is_computed() -> None:
    """A derived field is computed from the other fields at construction."""
    assert Dataset(samples=[1, 2, 3]).n == 3


def test_derived_field_is_not_a_constructor_parameter() -> None:
    """A derived field cannot be passed to the constructor."""
    with pytest.raises(TypeError):
        Dataset(samples=[], n=3)  # type: ignore[call-arg]


def test_zero_argument_derived() -> None:
    """A derived callable taking no arguments is called as derived()."""

    class P(js.Struct):
        x: int
        tag: str = js.field(static=True, init=False, derived=lambda: "const")

    assert P(1).tag == "const"


def test_derived_callable_with_optional_parameter_is_zero_argument() -> None:
    """A derived callable whose only parameter has a default is called without arguments."""

    class P(js.Struct):
        x: int
        tag: str = js.field(static=True, init=False, derived=lambda k="d": k)

    assert P(1).tag == "d"


def test_derived_opaque_field() -> None:
    """A derived field may be opaque."""

    class P(js.Struct):
        x: int
        cache: object = js.field(pytree=False, init=False, derived=lambda self: {"x": self.x})

    assert P(2).cache == {"x": 2}


def test_derived_node_field_is_a_definition_error() -> None:
    """A derived node field is rejected naming the class, the field and both fixes."""
    with pytest.raises(js.StructDefinitionError) as info:

        class Bad(js.Struct):
            x: int = js.field(init=False, derived=lambda self: 1)

    message = str(info.value)
    assert "Bad" in message and "'x'" in message
    assert "static=True" in message and "pytree=False" in message


def test_derived_field_with_init_true_is_a_definition_error() -> None:
    """A derived field must be init=False."""
    with pytest.raises(js.StructDefinitionError, match=r"Bad.*'x'.*init=False"):

        class Bad(js.Struct):
            x: int = js.field(static=True, derived=lambda: 1)


def test_derived_field_with_default_is_a_definition_error() -> None:
    """A derived field takes no default."""
    with pytest.raises(js.StructDefinitionError, match=r"Bad.*'x'"):

        class Bad(js.Struct):
            x: int = js.field(static=True, init=False, default=1, derived=lambda: 1)


def test_derived_is_computed_twice_during_construction() -> None:
    """Construction computes derived fields before and after __post_init__."""
    calls: list[str] = []

    class P(js.Struct):
        x: int
        y: int = js.field(
            static=True, init=False, derived=lambda self: calls.append("derived") or 0
        )

        def __post_init__(self) -> None:
            calls.append("post_init")

    P(1)
    assert calls == ["derived", "post_init", "derived"]


def test_derived_runs_twice_without_post_init_and_once_on_build() -> None:
    """Construction and replace compute derived fields twice even with no __post_init__;
    building from stored values (loading) computes them once."""
    calls: list[int] = []

    class Counted(js.Struct):
        x: int
        y: int = js.field(static=True, init=False, derived=lambda self: calls.append(1) or 2)

    c = Counted(1)
    assert len(calls) == 2
    c.replace(x=3)
    assert len(calls) == 4
    js.build(Counted, {"x": 5})
    assert len(calls) == 5
    c.rederive()
    assert len(calls) == 6


def test_derived_sees_post_init_changes() -> None:
    """The second derived computation reflects __post_init__ changes."""

    class Model(js.Struct):
        x: int
        y: int = js.field(static=True, init=False, derived=lambda self: self.x * 2)

        def __post_init__(self) -> None:
            self.x = self.x + 1

    m = Model(x=2)
    assert (m.x, m.y) == (3, 6)


def test_derived_available_inside_post_init() -> None:
    """__post_init__ sees derived values from the first computation."""
    seen: list[int] = []

    class P(js.Struct):
        x: int
        y: int = js.field(static=True, init=False, derived=lambda self: self.x + 1)

        def __post_init__(self) -> None:
            seen.append(self.y)

    P(1)
    assert seen == [2]


def test_derived_recomputed_after_replace() -> None:
    """replace() recomputes derived fields from the new values."""
    assert Dataset(samples=[1]).replace(samples=[1, 2, 3, 4]).n == 4


def test_replace_derived_field_raises_type_error() -> None:
    """replace() of a derived field is a TypeError naming the field."""
    with pytest.raises(TypeError, match=r"'n'.*derived"):
        Dataset(samples=[1]).replace(n=10)


def test_rederive_recomputes_stale_derived_values() -> None:
    """rederive() recomputes derived fields after an in-place change."""

    class Bag(js.Struct):
        items: list
        size: int = js.field(static=True, init=False, derived=lambda self: len(self.items))

    bag = Bag(items=[1, 2])
    bag.items.append(3)
    assert bag.size == 2
    bag.rederive()
    assert bag.size == 3


def test_rederive_returns_the_instance() -> None:
    """rederive() returns the same instance."""
    ds = Dataset(samples=[])
    assert ds.rederive() is ds


def test_rederive_updates_the_pytree_aux_data() -> None:
    """After rederive(), flattening sees the recomputed static value."""
    import jax

    bag = Dataset(samples=[1])
    bag.samples.append(2)
    bag.rederive()
    rebuilt = jax.tree_util.tree_map(lambda x: x, bag)
    assert rebuilt.n == 2


def test_derived_value_passes_through_converter() -> None:
    """A derived field's converter applies to the computed value."""

    class P(js.Struct):
        x: int
        label: str = js.field(static=True, init=False, derived=lambda self: self.x, converter=str)

    assert P(3).label == "3"


def test_derived_validator_runs() -> None:
    """Validators run on derived values."""

    class P(js.Struct):
        xs: tuple
        n: int = js.field(
            static=True, init=False, derived=lambda self: len(self.xs), validator=_positive
        )

    with pytest.raises(js.ValidationError, match=r"P\.n"):
        P(())
