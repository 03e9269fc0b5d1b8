"""Trust the library owns (issue 45): a plugin format written from docs/plugins.md's minimum
(write, sniff, open, read_arrays; no checksums, no check_members) never loads wrong data, and
never publishes a checkpoint that does not hold its arrays."""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jaxstruct.io as jio
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io import PluginRegistry
from jaxstruct.io._cli import main
from jaxstruct.registry import SerializationError

from ._minimal import Minimal


class Dist:
    def __init__(self, name: str) -> None:
        self.name = name
        self.version = "1.0"
        self.metadata = {"Name": name}


@pytest.fixture
def minimal(monkeypatch: pytest.MonkeyPatch) -> Iterator[Minimal]:
    """The minimal format, installed for this test as distribution 'dist-minimal' provides it."""
    fmt = Minimal()
    plugin = types.SimpleNamespace(jaxstruct_register_formats=jio.hookimpl(lambda: [fmt]))
    entry = types.SimpleNamespace(name="minimal", dist=Dist("dist-minimal"), load=lambda: plugin)
    registry = PluginRegistry(entry_points=lambda: [entry], autoload=True)
    monkeypatch.setattr(jio._plugins, "_registry", registry)
    yield fmt


VALUE = {"w": np.arange(600_000, dtype=np.float32).reshape(1000, 600), "step": np.int64(7)}


def _flip(path: Path, at: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1 << bit
    path.write_bytes(bytes(data))


def _data_offset(path: Path) -> int:
    data = path.read_bytes()
    return 16 + int.from_bytes(data[8:16], "little")


def _names_plugin(err: SerializationError) -> None:
    assert "'minimal' format" in str(err) and "dist-minimal" in str(err), str(err)


def test_the_minimal_format_round_trips(minimal: Minimal, tmp_path: Path) -> None:
    """The docs' minimum is enough for a checked round trip."""
    path = jio.export(VALUE, tmp_path / "a.mini")
    out = jio.load(path)
    np.testing.assert_array_equal(out["w"], VALUE["w"])
    assert jio.inspect(path).checksums.startswith("CRC-32 of every 1 MiB piece")


@pytest.mark.parametrize("how", ["whole", "select", "target", "sharded"])
def test_a_flipped_data_byte_never_loads(minimal: Minimal, tmp_path: Path, how: str) -> None:
    """One flipped byte of array data fails every kind of load with our error naming the
    file, the array, the format and its distribution."""
    path = jio.export(VALUE, tmp_path / "a.mini")
    _flip(path, _data_offset(path) + 8 + 4 * 300_000, 3)  # inside w (after step's 8 bytes)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    loads: dict[str, Callable[[], Any]] = {
        "whole": lambda: jio.load(path),
        "select": lambda: jio.load(path, select=lambda v: v["w"]),
        "target": lambda: jio.load(path, target=jax.eval_shape(lambda: VALUE)),
        "sharded": lambda: jio.load(
            path,
            target={
                "w": jax.ShapeDtypeStruct(
                    (1000, 600), np.float32, sharding=NamedSharding(mesh, P("x", "y"))
                ),
                "step": None,
            },
        ),
    }
    with pytest.raises(SerializationError, match=r"'w' \(a\d\) does not match its checksum") as err:
        loads[how]()
    assert str(path) in str(err.value)
    _names_plugin(err.value)


def test_an_array_jax_would_convert_on_placement_is_still_checked(
    minimal: Minimal, tmp_path: Path
) -> None:
    """A float64 array placed on a device without x64 (JAX converts it) is checked on the
    host first: the flip is found, and a sound file loads as JAX places it."""
    value = {"d": np.linspace(0, 1, 4096)}
    path = jio.export(value, tmp_path / "d.mini")
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), P())
    target = {"d": jax.ShapeDtypeStruct((4096,), np.float64, sharding=sharding)}
    out = jio.load(path, target=target)
    np.testing.assert_allclose(np.asarray(out["d"]), value["d"], rtol=1e-6)
    _flip(path, _data_offset(path) + 1000)
    with pytest.raises(SerializationError, match="does not match its checksum"):
        jio.load(path, target=target)


def test_every_single_bit_flip_of_the_manifest_is_refused_or_harmless(
    minimal: Minimal, tmp_path: Path
) -> None:
    """Each single flipped bit of the stored manifest either fails the load with our error
    or loads exactly the value written (none loads wrong data, none turns checking off: a
    data flip after it still fails)."""
    small = {"w": np.arange(6, dtype=np.int32), "name": "run"}
    path = jio.export(small, tmp_path / "s.mini")
    good = path.read_bytes()
    size = int.from_bytes(good[8:16], "little")
    refused = 0
    for bit in range(size * 8):
        flipped = bytearray(good)
        flipped[16 + bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(flipped))
        try:
            out = jio.load(path)
        except SerializationError:
            refused += 1
            continue
        assert out["name"] == "run" and out["w"].tolist() == list(range(6)), bit
        flipped[-1] ^= 1  # then a flipped data byte: checking must still be on
        path.write_bytes(bytes(flipped))
        with pytest.raises(SerializationError):
            jio.load(path)
    assert refused >= size * 8 - 8


def test_a_write_that_forgets_the_arrays_never_replaces_a_checkpoint(
    minimal: Minimal, tmp_path: Path
) -> None:
    """A format whose write stores the manifest but not the arrays: overwrite=True fails
    naming the format and distribution, and the previous checkpoint stays, whole."""
    path = jio.export(VALUE, tmp_path / "a.mini")
    minimal.forget_arrays = True
    with pytest.raises(SerializationError) as err:
        jio.export({"w": VALUE["w"] * 2, "step": np.int64(8)}, path, overwrite=True)
    _names_plugin(err.value)
    minimal.forget_arrays = False
    out = jio.load(path)
    np.testing.assert_array_equal(out["w"], VALUE["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mini"]


def test_a_write_that_forgets_the_arrays_publishes_nothing(
    minimal: Minimal, tmp_path: Path
) -> None:
    """The same format at a fresh path: the export fails and nothing appears."""
    minimal.forget_arrays = True
    with pytest.raises(SerializationError) as err:
        jio.export(VALUE, tmp_path / "a.mini")
    _names_plugin(err.value)
    assert list(tmp_path.iterdir()) == []


def test_verify_exits_non_zero_when_an_array_fails(
    minimal: Minimal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`jaxstruct inspect --verify` of a damaged checkpoint exits 1 naming the array; of a
    sound one, 0."""
    path = jio.export(VALUE, tmp_path / "a.mini")
    assert main(["inspect", str(path), "--verify"]) == 0
    _flip(path, _data_offset(path) + 100)
    assert main(["inspect", str(path), "--verify"]) == 1
    assert "does not match its checksum" in capsys.readouterr().err


def test_verify_exits_non_zero_when_nothing_could_be_checked(
    minimal: Minimal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint that carries no checksums at all (format version 1, a format without
    its own) is read, and --verify says nothing was checked and exits 3."""
    path = jio.export(VALUE, tmp_path / "a.mini")
    data = path.read_bytes()
    size = int.from_bytes(data[8:16], "little")
    top = json.loads(data[16 : 16 + size])
    top.pop("seal")
    top.pop("checksums")
    top["version"] = 1
    old = json.dumps(top, separators=(",", ":")).encode()
    path.write_bytes(data[:8] + len(old).to_bytes(8, "little") + old + data[16 + size :])
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])  # old files still load
    assert main(["inspect", str(path), "--verify"]) == 3
    assert "no checksums" in capsys.readouterr().out
