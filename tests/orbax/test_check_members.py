"""Before it publishes an orbax checkpoint, export proves every array is there from the
storage item and each array's store metadata (``check_members``), reading no data back."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jax
import jaxstruct.io as jio
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io import ArraySpec, Limits
from jaxstruct.orbax import OrbaxFormat, _opened
from jaxstruct.registry import SerializationError


def _value() -> dict[str, Any]:
    mesh = jax.make_mesh((len(jax.devices()),), ("x",))
    sharded = jax.device_put(
        np.arange(64 * 4, dtype=np.float32).reshape(64, 4), NamedSharding(mesh, P("x"))
    )
    return {
        "w": sharded,
        "b": np.arange(7, dtype=np.int16),
        "m": np.array([True, False]),
        "e": np.zeros((0, 2), np.float32),
    }


def _opened_with_table(path: Path) -> tuple[Any, dict[str, ArraySpec]]:
    opened = OrbaxFormat().open(path, Limits())
    assert opened.manifest is not None
    arrays = json.loads(bytes(opened.manifest))["arrays"]
    table = {}
    for key, entry in arrays.items():
        dtype, shape = np.dtype(entry["dtype"]), tuple(entry["shape"])
        table[key] = ArraySpec(dtype, shape, int(np.prod(shape)) * dtype.itemsize)
    return opened, table


def test_members_of_a_written_checkpoint_pass(tmp_path: Path) -> None:
    """check_members accepts exactly the table the manifest of a checkpoint we wrote names."""
    jio.export(_value(), tmp_path / "c", format="orbax")
    opened, table = _opened_with_table(tmp_path / "c")
    opened.check_members(table)


@pytest.mark.parametrize("change", ["missing", "dtype", "shape"])
def test_members_that_differ_are_refused(tmp_path: Path, change: str) -> None:
    """A table naming an array the checkpoint lacks, or with another dtype or shape, is refused."""
    jio.export(_value(), tmp_path / "c", format="orbax")
    opened, table = _opened_with_table(tmp_path / "c")
    key = max(table, key=lambda k: table[k].nbytes)  # the sharded float32 array
    spec = table[key]
    if change == "missing":
        table["absent"] = spec
    elif change == "dtype":
        table[key] = ArraySpec(np.dtype(np.int32), spec.shape, spec.nbytes)
    else:
        table[key] = ArraySpec(spec.dtype, (32, 8), spec.nbytes)
    with pytest.raises(SerializationError, match=re.escape(str(tmp_path / "c"))):
        opened.check_members(table)


def test_units_that_do_not_cover_an_array_are_refused(tmp_path: Path) -> None:
    """An array whose unit checksums leave part of it uncovered is refused by check_members."""
    jio.export(_value(), tmp_path / "c", format="orbax")
    opened, table = _opened_with_table(tmp_path / "c")
    assert opened.units is not None
    key = max(table, key=lambda k: table[k].nbytes)
    opened.units[key] = opened.units[key][1:]
    with pytest.raises(SerializationError, match="do not cover it exactly"):
        opened.check_members(table)


def test_export_reads_no_array_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An export's check before publishing reads no array data (the metadata answers)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("export read array data back")

    monkeypatch.setattr(_opened, "read_into_host", refuse)
    monkeypatch.setattr(_opened, "read_into_shards", refuse)
    value = _value()
    jio.export(value, tmp_path / "c", format="orbax")
    monkeypatch.undo()
    got = jio.load(tmp_path / "c")
    for key, want in value.items():
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want))
