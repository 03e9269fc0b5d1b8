"""Errors raised while building a struct say which class, field and check refused."""

from __future__ import annotations

import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from jaxtyping import Array, Float


def _positive(n: int) -> bool:
    return n > 0


def _odd(n: int) -> None:
    if n % 2 == 0:
        raise ValueError(f"{n} is even")


def _to_int(value: object) -> int:
    return int(value)  # type: ignore[call-overload]


class Hooked(js.Struct):
    n: int = js.field(default=1, validator=_positive)
    m: int = js.field(default=1, validator=_odd)
    k: int = js.field(default=0, converter=_to_int)
    tag: object = js.field(static=True, default="a")
    lo: int = 0

    def __post_init__(self) -> None:
        if self.lo > 5:
            raise js.ValidationError("lo is too big")

    def __check_init__(self) -> None:
        if self.lo < 0:
            raise AssertionError("lo < 0")


def _refusal(fn: object, *args: object, **kwargs: object) -> tuple[BaseException, js.Refusal]:
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)  # type: ignore[operator]
    found = js.refusal_of(info.value)
    assert found is not None, repr(info.value)
    return info.value, found


def test_validator_returning_false() -> None:
    """A validator returning False: class, field, 'validator', the validator, a short reason."""
    err, why = _refusal(Hooked, n=0)
    assert isinstance(err, js.ValidationError) and err.refusal == why
    assert (why.cls, why.field, why.check, why.hook) == (Hooked, "n", "validator", _positive)
    assert why.reason == "validator '_positive' rejected 0"


def test_validator_raising_keeps_its_exception() -> None:
    """A validator's own ValueError is raised as is, with the refusal recorded on it."""
    err, why = _refusal(Hooked, m=2)
    assert type(err) is ValueError and str(err) == "2 is even"
    assert (why.field, why.check, why.hook) == ("m", "validator", _odd)


def test_converter() -> None:
    """A converter's error names the field and the converter."""
    err, why = _refusal(Hooked, k="x")
    assert isinstance(err, ValueError)
    assert (why.cls, why.field, why.check, why.hook) == (Hooked, "k", "converter", _to_int)
    assert why.reason.startswith("converter _to_int raised ValueError")


def test_static_check() -> None:
    """An unhashable or array static value: 'static'."""
    _, why = _refusal(Hooked, tag=[1])
    assert (why.field, why.check, why.reason) == ("tag", "static", "unhashable list")
    _, why = _refusal(Hooked, tag=np.ones(2))
    assert why.check == "static" and why.reason.startswith("holds an array")


def test_post_init_and_check_init() -> None:
    """Errors out of __post_init__ and __check_init__ name the hook and no field."""
    err, why = _refusal(Hooked, lo=6)
    assert isinstance(err, js.ValidationError) and str(err) == "lo is too big"
    assert (why.field, why.check) == (None, "post_init")
    assert why.reason == "Hooked.__post_init__ raised ValidationError: lo is too big"
    err, why = _refusal(Hooked, lo=-1)
    assert type(err) is AssertionError
    assert (why.field, why.check, why.hook) == (None, "check_init", Hooked.__check_init__)


def test_build_missing_and_unknown() -> None:
    """js.build with a missing or unknown field: 'missing' / 'unknown'."""

    class Needs(js.Struct):
        x: int

    _, why = _refusal(js.build, Needs, {})
    assert (why.cls, why.field, why.check) == (Needs, "x", "missing")
    _, why = _refusal(js.build, Needs, {"x": 1, "y": 2})
    assert (why.field, why.check) == ("y", "unknown")


def test_unassigned_field() -> None:
    """A field __post_init__ never assigns: 'missing'."""

    class Lazy(js.Struct):
        x: int = js.field(init=False)

        def __post_init__(self) -> None:
            pass

    err, why = _refusal(Lazy)
    assert isinstance(err, js.UnassignedFieldError)
    assert (why.field, why.check) == ("x", "missing")


def test_type_check() -> None:
    """typecheck=True mismatches: 'type'."""

    class Typed(js.Struct, typecheck=True):
        w: Float[Array, "n m"]  # noqa: F722

    _, why = _refusal(Typed, w=jnp.ones(3))
    assert (why.cls, why.field, why.check) == (Typed, "w", "type")
    assert why.reason.startswith("expected Float[Array, 'n m']")


def test_nested_refusal_keeps_the_innermost() -> None:
    """A struct built inside another's __post_init__ keeps its own refusal."""

    class Outer(js.Struct):
        n: int

        def __post_init__(self) -> None:
            Hooked(n=self.n)

    _, why = _refusal(Outer, n=0)
    assert (why.cls, why.field, why.check) == (Hooked, "n", "validator")


def test_errors_not_from_construction_have_none() -> None:
    """Any other exception carries no refusal."""
    assert js.refusal_of(ValueError("x")) is None
    assert js.ValidationError("x").refusal is None


def test_has_custom_init() -> None:
    """has_custom_init says whether a class has a hand-written __init__."""

    class Plain(js.Struct):
        x: float

    class Own(js.Struct):
        x: float

        def __init__(self, raw: float) -> None:
            self.x = raw * 2  # pyright: ignore[reportAttributeAccessIssue]

    assert not js.has_custom_init(Plain) and js.has_custom_init(Own)
    assert js.has_custom_init(Own(1.0))
    with pytest.raises(TypeError, match="expected a Struct class or instance"):
        js.has_custom_init(int)
