"""`jaxstruct inspect --json` and `--verify`: reading a checkpoint without JAX arrays."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io._cli import main
from jaxstruct.io._inspect import verify_report
from jaxstruct.registry import SerializationError


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
    assert report["container"] == "zip" and report["version"] == 2
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
    top = json.loads(manifest.read_text().replace('"shape":[6]', '"shape":[2,3]'))
    manifest.write_bytes(jio.seal_manifest(top))  # edited on purpose: sealed anew
    problems = verify_report(path)[0]
    assert len(problems) == 1 and "a0.npy" in problems[0] and "(6,)" in problems[0]


def test_verify_reports_a_missing_member(tmp_path: Path) -> None:
    """An array the manifest names but the archive lacks is reported by name."""
    path = jio.export({"w": np.zeros(2)}, tmp_path / "ck")
    other = jio.export({}, tmp_path / "empty")
    (other / "arrays.npz").replace(path / "arrays.npz")
    assert verify_report(path)[0] == [f"{str(path)!r} (arrays.npz): member 'a0.npy' is missing"]


class _Layer(js.Struct):
    w: object
    act: str = js.field(static=True, default="relu")
    note: object = js.field(pytree=False, default="x", serialize=True)


def test_tree_view_marks_node_static_and_opaque_fields(tmp_path: Path) -> None:
    """inspect marks each struct field as node, static or opaque, in text and JSON."""
    path = jio.export(_Layer(np.ones(2, np.float32)), tmp_path / "ck")
    info = jio.inspect(path)
    lines = info.tree.splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == [
        ".w [node]",
        ".act [static]",
        ".note [opaque]",
    ]
    edges = [c["edge"] for c in info.to_json()["tree"]["children"]]
    assert edges == [".w [node]", ".act [static]", ".note [opaque]"]


def test_struct_nodes_without_field_kinds_still_load(tmp_path: Path) -> None:
    """A struct node written before field kinds existed (four items) loads and inspects."""
    state = jio.to_state_dict(_Layer(np.ones(2, np.float32)))
    node = state["manifest"]["nodes"][state["manifest"]["root"]]
    assert node[4] == "nso"
    del node[4]
    assert jio.from_state_dict(state).act == "relu"


def test_malformed_field_kinds_are_refused() -> None:
    """Field-kind letters that do not match the fields are a SerializationError."""
    state = jio.to_state_dict(_Layer(np.ones(2, np.float32)))
    state["manifest"]["nodes"][state["manifest"]["root"]][4] = "nx"
    with pytest.raises(SerializationError, match="malformed struct node"):
        jio.from_state_dict(state)


@pytest.mark.parametrize("suffix", ["", ".zip"], ids=["directory", "zip"])
def test_report_says_what_protects_the_bytes(
    suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """inspect names the built-in formats' checksums, in the report, its text and --json."""
    path = jio.export(_value(), tmp_path / f"ck{suffix}")
    info = jio.inspect(path)
    assert info.checksums == "CRC-32 of every member, the manifest's included"
    assert info.has_manifest and info.note == ""
    assert str(info).splitlines()[1] == f"checksums: {info.checksums}"
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checksums"] == info.checksums and report["has_manifest"] is True


def test_a_directory_manifest_without_its_crc_is_reported(tmp_path: Path) -> None:
    """A directory checkpoint whose manifest.json carries no CRC (written before manifests
    had one, or unzipped from a .zip) says its manifest is unchecked."""
    path = jio.export({"w": np.zeros(6, np.float32)}, tmp_path / "ck")
    manifest = path / "manifest.json"
    manifest.write_text(re.sub(r',"checksum":"[^"]*"\}\s*$', "}", manifest.read_text()))
    assert jio.inspect(path).checksums == (
        "CRC-32 of every array member; manifest.json has none (written before manifests "
        "carried one, or unzipped from a .zip)"
    )
