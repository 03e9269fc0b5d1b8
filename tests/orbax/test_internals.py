"""orbax-checkpoint internals are used in one module of jaxstruct.orbax, guarded."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("orbax.checkpoint")

from jaxstruct.orbax import _orbax_internals
from jaxstruct.registry import SerializationError

PACKAGE = Path(__file__).resolve().parents[2] / "packages" / "orbax" / "src" / "jaxstruct" / "orbax"


def test_orbax_internals_sit_behind_one_module() -> None:
    """Only _orbax_internals names orbax's type_handlers or its step metadata file."""
    users = sorted(
        path.name
        for path in PACKAGE.glob("*.py")
        if re.search(r"type_handlers|_CHECKPOINT_METADATA", path.read_text())
    )
    assert users == ["_orbax_internals.py"]


def test_missing_internals_raise_our_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An orbax release without the internals fails with our error naming the installed
    version, the tested one and the fix."""
    import orbax.checkpoint as ocp

    monkeypatch.delattr(ocp.type_handlers, "get_json_tspec_read")
    with pytest.raises(SerializationError) as info:
        _orbax_internals.open_array_stores(tmp_path, ["a"], use_zarr3=False, cache_bytes=1 << 20)
    message = str(info.value)
    assert f"orbax-checkpoint {ocp.__version__} lacks" in message
    assert "get_json_tspec_read" in message
    assert f"tested with orbax-checkpoint {_orbax_internals.TESTED}" in message
    assert f"pip install 'orbax-checkpoint=={_orbax_internals.TESTED}.*'" in message


def test_declared_requirement_matches_the_seam() -> None:
    """The requirement in pyproject.toml is the seam's range, without an upper bound."""
    text = (PACKAGE.parents[2] / "pyproject.toml").read_text()
    assert f'"orbax-checkpoint{_orbax_internals.SUPPORTED}"' in text
    assert "<" not in _orbax_internals.SUPPORTED


def test_the_tested_minor_is_the_locked_one() -> None:
    """The minor version the seam's errors name is the one uv.lock (and so CI) tests."""
    import tomllib

    lock = tomllib.loads((PACKAGE.parents[4] / "uv.lock").read_text())
    locked = {p["version"] for p in lock["package"] if p["name"] == "orbax-checkpoint"}
    assert {".".join(v.split(".")[:2]) for v in locked} == {_orbax_internals.TESTED}
