"""`jaxstruct inspect --json` and `--verify`: reading a checkpoint without JAX arrays."""

from __future__ import annotations

import json
from pathlib import Path

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io._cli import main
from jaxstruct.io._inspect import verify


def _corrupt(path: Path, needle: bytes) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(needle)
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _value() -> dict[str, np.ndarray]:
    return {"a": np.full(1000, 7, np.int32), "b": np.arange(300.0), "c": np.ones(5, np.float32)}


def test_json_report_has_arrays_and_the_nested_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json prints the container, version, arrays table and the tree as nested dicts."""
    path = jio.export({"w": np.zeros((2, 3), np.float32), "n": 1}, tmp_path / "ck.zip")
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["container"] == "zip" and report["version"] == 1
    assert report["arrays"]["a0"] == {"dtype": "<f4", "shape": [2, 3], "nbytes": 24}
    tree = report["tree"]
    assert tree["label"] == "dict (2 items)"
    assert [c["edge"] for c in tree["children"]] == ["['w']", "['n']"]


@pytest.mark.parametrize("suffix", ["", ".zip"], ids=["directory", "zip"])
def test_verify_passes_a_sound_checkpoint(
    suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--verify on an intact checkpoint exits 0 and says so."""
    path = jio.export(_value(), tmp_path / f"ck{suffix}", compression="auto")
    assert main(["inspect", str(path), "--verify"]) == 0
    assert "every member is sound" in capsys.readouterr().out


def test_verify_names_every_corrupt_member_of_a_zip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Corrupted array bytes in a zip make --verify exit 1 naming each bad member."""
    path = jio.export(_value(), tmp_path / "ck.zip", compression="none")
    _corrupt(path, np.full(4, 7, np.int32).tobytes())  # inside a0.npy
    _corrupt(path, np.arange(300.0)[100:104].tobytes())  # inside a1.npy
    assert main(["inspect", str(path), "--verify"]) == 1
    err = capsys.readouterr().err
    assert "'a0.npy'" in err and "'a1.npy'" in err and "'a2.npy'" not in err
    assert "CRC" in err


def test_verify_checks_shapes_against_the_manifest(tmp_path: Path) -> None:
    """A member whose .npy header disagrees with the manifest is reported."""
    path = jio.export({"w": np.zeros(6, np.float32)}, tmp_path / "ck")
    manifest = path / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"shape":[6]', '"shape":[2,3]'))
    problems = verify(path)
    assert len(problems) == 1 and "a0.npy" in problems[0] and "(6,)" in problems[0]


def test_verify_reports_a_missing_member(tmp_path: Path) -> None:
    """An array the manifest names but the archive lacks is reported by name."""
    path = jio.export({"w": np.zeros(2)}, tmp_path / "ck")
    other = jio.export({}, tmp_path / "empty")
    (other / "arrays.npz").replace(path / "arrays.npz")
    assert verify(path) == [f"{str(path)!r} (arrays.npz): member 'a0.npy' is missing"]
