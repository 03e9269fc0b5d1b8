"""Checkpoints that survive code changes: schema versions, migrations, added and removed fields."""

from __future__ import annotations

from typing import Any, ClassVar

import jaxstruct.core as js
import jaxstruct.io as jio
import pytest
from jaxstruct.registry import SerializationError


class V0(js.Struct):
    lr: float = js.field(static=True)
    name: str = js.field(static=True)


def _as(payload: dict[str, Any], cls: type) -> dict[str, Any]:
    """Pretend ``payload`` was written by an older definition of ``cls``."""
    from jaxstruct.registry import class_ref

    payload["manifest"]["nodes"][-1][1] = class_ref(cls)
    return payload


class Renamed(js.Struct):
    __struct_version__: ClassVar[int] = 2
    learning_rate: float = js.field(static=True)
    label: str = js.field(static=True)
    calls: ClassVar[list[int]] = []

    @classmethod
    def __struct_migrate__(cls, from_version: int, fields: dict[str, Any]) -> dict[str, Any]:
        cls.calls.append(from_version)
        if from_version == 0:
            fields["learning_rate"] = fields.pop("lr")
        elif from_version == 1:
            fields["label"] = fields.pop("name").upper()
        return fields


class WithDefault(js.Struct):
    lr: float = js.field(static=True)
    name: str = js.field(static=True)
    momentum: float = js.field(static=True, default=0.9)


class NeedsMore(js.Struct):
    lr: float = js.field(static=True)
    name: str = js.field(static=True)
    required: int = js.field(static=True)


class Fewer(js.Struct):
    lr: float = js.field(static=True)


class NoHook(js.Struct):
    __struct_version__: ClassVar[int] = 1
    lr: float = js.field(static=True)
    name: str = js.field(static=True)


def test_migrations_run_in_order() -> None:
    """Loading a version-0 payload into a version-2 class runs the hook for 0 then 1."""
    Renamed.calls.clear()
    out = jio.from_state_dict(_as(jio.to_state_dict(V0(lr=0.1, name="run")), Renamed))
    assert Renamed.calls == [0, 1]
    assert (out.learning_rate, out.label) == (0.1, "RUN")


def test_current_version_is_stored_and_skips_migrations(tmp_path) -> None:
    """A checkpoint written at the current version loads without calling the hook."""
    Renamed.calls.clear()
    path = jio.export(Renamed(learning_rate=1.0, label="x"), tmp_path / "c")
    assert jio.load(path) == Renamed(learning_rate=1.0, label="x")
    assert Renamed.calls == []


def test_field_added_with_default_loads_without_a_hook() -> None:
    """A field added with a default is filled from the default."""
    out = jio.from_state_dict(_as(jio.to_state_dict(V0(lr=0.1, name="run")), WithDefault))
    assert out.momentum == 0.9


def test_missing_required_field_is_a_clear_error() -> None:
    """A required field absent from the checkpoint names the field and the fix."""
    with pytest.raises(SerializationError, match=r"required.*'required'.*__struct_migrate__"):
        jio.from_state_dict(_as(jio.to_state_dict(V0(lr=0.1, name="run")), NeedsMore))


def test_unknown_stored_field_is_a_clear_error() -> None:
    """A stored field the class no longer has is an error naming it."""
    with pytest.raises(SerializationError, match=r"'name'.*not fields"):
        jio.from_state_dict(_as(jio.to_state_dict(V0(lr=0.1, name="run")), Fewer))


def test_older_version_without_hook_is_an_error() -> None:
    """An older schema version and no __struct_migrate__ is an error saying so."""
    with pytest.raises(SerializationError, match="__struct_migrate__"):
        jio.from_state_dict(_as(jio.to_state_dict(V0(lr=0.1, name="run")), NoHook))


def test_newer_version_is_refused() -> None:
    """A checkpoint from a newer schema version than the code is refused."""
    payload = jio.to_state_dict(NoHook(lr=1.0, name="n"))
    payload["manifest"]["nodes"][-1][2] = 5
    with pytest.raises(SerializationError, match="newer"):
        jio.from_state_dict(payload)


def test_failing_migration_is_wrapped() -> None:
    """An exception inside a migration hook surfaces as a SerializationError."""
    payload = _as(jio.to_state_dict(Fewer(lr=1.0)), Renamed)
    with pytest.raises(SerializationError, match="__struct_migrate__"):
        jio.from_state_dict(payload)
