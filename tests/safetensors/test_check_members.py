"""Before it publishes a ``.safetensors`` file, export proves every array is there from
the header (``check_members``), reading no tensor data back."""

from __future__ import annotations

import json
from pathlib import Path

import jaxstruct.io as jio
import ml_dtypes
import numpy as np
import pytest
from jaxstruct.io import ArraySpec, Limits
from jaxstruct.registry import SerializationError
from jaxstruct.safetensors import SafetensorsFormat, _format

VALUE = {
    "w": np.arange(12, dtype=np.float32).reshape(3, 4),
    "h": np.ones(5, dtype=ml_dtypes.bfloat16),
    "f": np.asfortranarray(np.arange(6, dtype=np.int8).reshape(2, 3)),
    "e": np.zeros((0, 3), np.float16),
}


def _opened(path: Path) -> tuple[jio.OpenedCheckpoint, dict[str, ArraySpec]]:
    opened = SafetensorsFormat().open(path, Limits())
    assert opened.manifest is not None
    arrays = json.loads(bytes(opened.manifest))["arrays"]
    return opened, {k: _spec(v) for k, v in arrays.items()}


def _spec(entry: dict) -> ArraySpec:
    dtype, shape = np.dtype(entry["dtype"]), tuple(entry["shape"])
    return ArraySpec(dtype, shape, int(np.prod(shape)) * dtype.itemsize)


def test_members_of_a_written_file_pass(tmp_path: Path) -> None:
    """check_members accepts exactly the table the manifest of a file we wrote names."""
    path = tmp_path / "m.safetensors"
    jio.export(VALUE, path)
    opened, table = _opened(path)
    try:
        opened.check_members(table)
    finally:
        opened.close()


@pytest.mark.parametrize(
    "change",
    ["missing", "extra", "dtype", "shape"],
)
def test_members_that_differ_are_refused(tmp_path: Path, change: str) -> None:
    """A table naming an array the header lacks, or with another dtype or shape, is refused."""
    path = tmp_path / "m.safetensors"
    jio.export(VALUE, path)
    opened, table = _opened(path)
    key = "w" if "w" in table else next(iter(table))
    spec = table[key]
    if change == "missing":
        table["absent"] = spec
    elif change == "extra":
        del table[key]
    elif change == "dtype":
        table[key] = ArraySpec(np.dtype(np.int32), spec[1], spec[2])
    else:
        table[key] = ArraySpec(spec[0], (4, 3, 1), spec[2])
    try:
        with pytest.raises(SerializationError, match=r"m\.safetensors"):
            opened.check_members(table)
    finally:
        opened.close()


def test_export_reads_no_tensor_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An export's check before publishing reads no tensor data (the header answers)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("export read tensor data back")

    monkeypatch.setattr(_format, "read_tensor", refuse)
    path = tmp_path / "m.safetensors"
    jio.export(VALUE, path)
    monkeypatch.undo()
    got = jio.load(path)
    for key, want in VALUE.items():
        np.testing.assert_array_equal(got[key], want)
