"""Messages that name two classes tell them apart when they share a name."""

from __future__ import annotations

import types
from pathlib import Path

import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.registry as reg
import pytest
from jaxstruct.registry import SerializationError


def _module(name: str, source: str) -> types.ModuleType:
    """A module of struct classes, as each algorithm of a library defines its own."""
    module = types.ModuleType(name)
    module.__dict__["js"] = js
    exec(source, module.__dict__)
    return module


_STATE = "class State(js.Struct):\n    mean: object\n"
es = _module("algo_es", _STATE)
ga = _module("algo_ga", _STATE)


class Point(js.Struct):
    x: object


class Vector(js.Struct):
    x: object


def test_name_classes_uses_qualnames_when_they_differ() -> None:
    """Classes of different names keep their short names."""
    assert reg.name_classes(Point, Vector) == ("Point", "Vector")
    assert reg.name_classes(Point, Point) == ("Point", "Point")


def test_name_classes_adds_the_module_where_names_collide() -> None:
    """Two classes called State are named by their references; others stay short."""
    assert reg.name_classes(es.State, ga.State, Point) == (
        "algo_es:State",
        "algo_ga:State",
        "Point",
    )


def test_name_classes_rejects_non_classes() -> None:
    """Anything but a class is a TypeError naming what was given."""
    with pytest.raises(TypeError, match="expected classes, got str 'State'"):
        reg.name_classes(es.State, "State")  # type: ignore[arg-type]


def test_from_state_dict_with_another_state_names_both_modules() -> None:
    """Loading one algorithm's State with another's names each by its module."""
    payload = es.State(jnp.zeros(2)).to_state_dict()
    with pytest.raises(SerializationError) as info:
        ga.State.from_state_dict(payload)
    assert str(info.value) == (
        "the payload holds a algo_es:State, not a algo_ga:State; load it with "
        "algo_es:State.load() or Struct.load(), or pass load_cls= to build a algo_ga:State "
        "from its fields"
    )


def test_load_with_another_class_keeps_short_names(tmp_path: Path) -> None:
    """Classes of different names are named as they are written in code."""
    path = tmp_path / "p.zip"
    Point(jnp.zeros(2)).export(path)
    with pytest.raises(SerializationError, match=r"holds a Point, not a Vector; load it with "):
        Vector.load(path)
    assert isinstance(Vector.load(path, load_cls=Vector), Vector)


def test_load_with_a_redefined_class_says_so(tmp_path: Path) -> None:
    """A class statement run again (same module and name) is named as another definition."""
    old = _module("algo_nb", _STATE).State
    path = tmp_path / "s.zip"
    old(jnp.zeros(2)).export(path)
    new = _module("algo_nb", _STATE).State  # the cell run again: the newer class resolves
    assert new is not old
    with pytest.raises(SerializationError, match="another definition than this algo_nb:State"):
        old.load(path)
    assert type(old.load(path, load_cls=old)) is old
