"""`inspect` of safetensors files: ours (checksummed) and other tools' (no manifest, no
checksums), through the function and the `jaxstruct inspect` command."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import jaxstruct.io as jio
import numpy as np
import pytest
import safetensors.numpy
from jaxstruct.io._cli import main
from jaxstruct.io._inspect import verify_report

from ._older import older


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    """A file ``safetensors.numpy.save_file`` wrote: two tensors, no jaxstruct metadata."""
    path = tmp_path / "m.safetensors"
    tensors = {"w": np.ones((3, 4), np.float32), "layer.b": np.arange(5, dtype=np.int64)}
    safetensors.numpy.save_file(tensors, str(path), metadata={"source": "test"})
    return path


def test_inspect_lists_a_foreign_files_tensors(foreign: Path) -> None:
    """inspect of a file another tool wrote lists its tensors (name, dtype, shape, size), says
    it has no manifest and no checksums, and how to load it."""
    info = jio.inspect(foreign)
    assert info.container == "safetensors" and info.version is None and not info.has_manifest
    assert info.arrays == {"layer.b": ("<i8", (5,), 40), "w": ("<f4", (3, 4), 48)}
    assert info.total_bytes == 88
    assert info.checksums == "none: written by another tool"
    assert "load(path) gives its arrays as a dict by name" in info.note
    assert "load(path, target=...)" in info.note
    lines = str(info).splitlines()
    assert lines[0] == (
        f"{foreign} (safetensors checkpoint without a jaxstruct manifest, 2 arrays, 88 B)"
    )
    assert lines[1] == "checksums: none: written by another tool"
    assert lines[2].startswith("note: another tool wrote it: jaxstruct.io.load(path) gives")
    assert lines[3:] == [
        "2 tensors by name (no jaxstruct manifest)",
        "  layer.b: <i8[5] 40 B",
        "  w: <f4[3, 4] 48 B",
    ]


def test_the_note_matches_what_load_does(foreign: Path) -> None:
    """What the note promises holds: load(path) is a dict of the tensors by name."""
    got = jio.load(foreign)
    assert sorted(got) == ["layer.b", "w"] and got["w"].shape == (3, 4)
    assert got["layer.b"].tolist() == [0, 1, 2, 3, 4]


def test_cli_text_and_json_of_a_foreign_file(
    foreign: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`jaxstruct inspect` prints the same report, and --json carries the new fields."""
    assert main(["inspect", str(foreign)]) == 0
    out = capsys.readouterr().out
    assert "checksums: none: written by another tool" in out and "  w: <f4[3, 4] 48 B" in out
    assert main(["inspect", str(foreign), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["version"] is None and report["has_manifest"] is False
    assert report["checksums"] == "none: written by another tool"
    assert "target=" in report["note"]
    assert report["arrays"]["w"] == {"dtype": "<f4", "shape": [3, 4], "nbytes": 48}
    assert [c["edge"] for c in report["tree"]["children"]] == ["layer.b", "w"]


def test_verify_of_a_foreign_file_reads_every_tensor_and_says_nothing_was_checked(
    foreign: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--verify reads each tensor of a foreign file, says no checksums were checked, and
    exits 3: nothing could be verified."""
    assert verify_report(foreign) == ([], False)
    assert main(["inspect", str(foreign), "--verify"]) == 3
    out = capsys.readouterr().out
    assert "every member is sound" not in out
    assert (
        "verify: every array read; no checksums were checked (checksums: none: written by "
        "another tool), so a changed byte would go unnoticed"
    ) in out
    assert main(["inspect", str(foreign), "--json", "--verify"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["verify"] == {"ok": True, "problems": [], "checksums": False}


def test_verify_of_a_truncated_foreign_file_names_the_tensor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A foreign file whose data is cut short is refused naming the tensor: status 2."""
    path = tmp_path / "cut.safetensors"
    safetensors.numpy.save_file({"w": np.ones(100, np.float32)}, str(path))
    path.write_bytes(path.read_bytes()[:-8])
    assert main(["inspect", str(path), "--verify"]) == 2
    err = capsys.readouterr().err
    assert "tensor 'w'" in err and "outside the file" in err and "manifest" not in err


def test_inspect_of_our_file_names_its_checksums(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file jaxstruct wrote is described by its manifest, with its piece CRCs named."""
    path = jio.export({"w": np.zeros((2, 3), np.float32)}, tmp_path / "ours.safetensors")
    info = jio.inspect(path)
    assert info.has_manifest and info.version == 2 and info.note == ""
    assert info.checksums == "CRC-32 per 1 MiB piece of every tensor, and of the header"
    assert str(info).splitlines()[1] == f"checksums: {info.checksums}"
    assert main(["inspect", str(path), "--json", "--verify"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checksums"] == info.checksums and report["has_manifest"] is True
    assert "note" not in report
    assert report["verify"] == {"ok": True, "problems": [], "checksums": True}


def _without_checksums(path: Path) -> None:
    """Rewrite ``path`` with its ``jaxstruct.checksums`` entry and their mark blanked out of
    the header (as an earlier jaxstruct-safetensors wrote it: the manifest, no checksums)."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    older(header["__metadata__"])
    text = json.dumps(header, separators=(",", ":")).encode().ljust(size)
    path.write_bytes(data[:8] + text + data[8 + size :])


def test_inspect_of_our_file_without_checksums_says_so(tmp_path: Path) -> None:
    """A jaxstruct file written before checksums loads and is reported as unchecked."""
    path = jio.export({"w": np.arange(4.0)}, tmp_path / "old.safetensors")
    _without_checksums(path)
    assert jio.load(path)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    info = jio.inspect(path)
    assert info.has_manifest
    assert info.checksums == (
        "none: written by an earlier jaxstruct-safetensors, which stored no checksums"
    )


def test_inspect_and_verify_of_a_foreign_file_run_without_importing_jax(foreign: Path) -> None:
    """`jaxstruct inspect --json --verify` of a file another tool wrote leaves JAX unloaded."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from jaxstruct.io._cli import main\n"
        "status = main(['inspect', sys.argv[1], '--json', '--verify'])\n"
        "print(status, 'jax' in sys.modules, 'jaxlib' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(foreign)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    *report, last = out.stdout.strip().splitlines()
    assert json.loads("\n".join(report))["verify"]["ok"] is True
    assert last == "3 False False"  # read, nothing to check
