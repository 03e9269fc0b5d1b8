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


def test_a_custom_parent_init_of_the_same_name_is_named_by_module() -> None:
    """A struct named like the plain class whose custom __init__ it would replace names
    that parent by module ("the __init__ inherited from base_algo:State")."""
    base = _module(
        "base_algo", "class State:\n    def __init__(self, mean):\n        self.mean = mean\n"
    )
    sub = types.ModuleType("algo_sub")
    sub.__dict__.update(js=js, base=base)
    with pytest.raises(js.StructDefinitionError, match=r"inherited from base_algo:State is custom"):
        exec("class State(base.State, js.Struct):\n    mean: object\n", sub.__dict__)


def test_a_deserializer_returning_a_same_named_class_is_named_by_module(tmp_path: Path) -> None:
    """A foreign class's deserializer returning another class of the same name says which
    is which."""
    import jaxstruct.io as jio

    mods = [types.ModuleType(name) for name in ("lib_a", "lib_b")]
    for mod in mods:
        exec("class Box:\n    def __init__(self, v):\n        self.v = v\n", mod.__dict__)
    a, b = (mod.Box for mod in mods)
    import sys

    sys.modules.update({"lib_a": mods[0], "lib_b": mods[1]})
    try:
        reg.register_pytree_type(
            a,
            flatten=lambda box: ((box.v,), None),
            unflatten=lambda _, children: b(*children),
        )
        jio.export({"box": a(jnp.zeros(2))}, tmp_path / "ckpt")
        with pytest.raises(SerializationError, match=r"returned lib_b:Box, not lib_a:Box"):
            jio.load(tmp_path / "ckpt", allow_imports=["lib_a"])
    finally:
        sys.modules.pop("lib_a", None)
        sys.modules.pop("lib_b", None)
