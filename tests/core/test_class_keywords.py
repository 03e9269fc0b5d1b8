"""Class keywords dataclasses and flax users expect (issue 11, item 10)."""

from __future__ import annotations

import dataclasses
import inspect

import jaxstruct.core as js
import pytest


class Base(js.Struct):
    a: int


def test_kw_only_class_keyword() -> None:
    """class B(A, kw_only=True) makes the class's own fields keyword-only."""

    class B(Base, kw_only=True):
        b: int

    assert str(inspect.signature(B)) == "(a: int, *, b: int) -> None"
    assert B(1, b=2).b == 2
    with pytest.raises(TypeError):
        B(1, 2)  # type: ignore[misc]


def test_kw_only_lets_required_fields_follow_defaults() -> None:
    """Keyword-only fields may be required after a parent's defaulted field."""

    class WithDefault(js.Struct):
        a: int = 0

    class B(WithDefault, kw_only=True):
        b: int

    assert B(b=1).a == 0


def test_kw_only_is_not_inherited() -> None:
    """As in dataclasses, kw_only=True covers the fields of that class only."""

    class B(Base, kw_only=True):
        b: int = 0

    class C(B):
        c: int = 0

    assert str(inspect.signature(C)) == "(a: int, c: int = 0, *, b: int = 0) -> None"


def test_kw_only_marker() -> None:
    """A dataclasses.KW_ONLY pseudo-field makes the fields after it keyword-only."""

    class B(js.Struct):
        a: int
        _: dataclasses.KW_ONLY
        b: int = 0

    assert str(inspect.signature(B)) == "(a: int, *, b: int = 0) -> None"
    assert list(js.fields(B)) == ["a", "b"]


def test_match_args_false() -> None:
    """match_args=False leaves __match_args__ empty."""

    class B(js.Struct, match_args=False):
        a: int

    assert B.__match_args__ == ()
    assert Base.__match_args__ == ("a",)


def test_frozen_true_is_accepted() -> None:
    """frozen=True (flax habit) is what structs are anyway."""

    class B(js.Struct, frozen=True):
        a: int

    with pytest.raises(js.FrozenStructError):
        B(1).a = 2  # type: ignore[misc]


def test_frozen_false_is_refused() -> None:
    """frozen=False raises, pointing to replace and opaque fields."""
    with pytest.raises(js.StructDefinitionError, match=r"frozen=False.*replace"):

        class B(js.Struct, frozen=False):
            a: int


@pytest.mark.parametrize("keyword", ["eq", "order", "unsafe_hash", "repr", "slots"])
def test_dataclass_only_keywords_are_refused_with_the_way_out(keyword: str) -> None:
    """Dataclass options structs do not take raise an error saying why and what to do."""
    with pytest.raises(js.StructDefinitionError, match=rf"{keyword}=.*kw_only="):
        type(js.Struct)("B", (js.Struct,), {"__annotations__": {"a": int}}, **{keyword: True})
