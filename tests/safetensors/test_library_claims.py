"""What docs/safetensors.md says about the safetensors library holds for the installed one.

When a release changes one of these, the test fails, and the guide (and perhaps
which reads go through the library) is to be revisited.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors
from safetensors import safe_open
from safetensors.numpy import save_file


def _rchar() -> int:
    with open("/proc/self/io") as handle:
        for line in handle:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar")  # pragma: no cover


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts reads through /proc")
def test_get_slice_with_pread_reads_the_whole_tensor(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    save_file({"w": np.zeros((256, 1024), np.float32)}, str(path))  # 1 MiB
    with safe_open(str(path), framework="numpy", backend="pread") as f:
        sliced = f.get_slice("w")
        before = _rchar()
        part = sliced[0:8]
        read = _rchar() - before
    assert part.nbytes == 8 * 1024 * 4
    assert read >= 256 * 1024 * 4


def test_its_numpy_side_cannot_return_float8(tmp_path: Path) -> None:
    path = tmp_path / "f8.safetensors"
    value = np.ones(4, ml_dtypes.float8_e4m3fn)
    spec = safetensors.TensorSpec(
        dtype="float8_e4m3fn", shape=[4], data_ptr=value.ctypes.data, data_len=4
    )
    safetensors.serialize_file({"f": spec}, str(path))
    for backend in ("mmap", "pread"):
        with safe_open(str(path), framework="numpy", backend=backend) as f:
            with pytest.raises(AttributeError, match="float8_e4m3fn"):
                f.get_tensor("f")


def test_it_accepts_a_header_repeating_a_key(tmp_path: Path) -> None:
    entry = '{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}'
    text = ('{"a":' + entry % (1, 1) + ',"a":' + entry % (2, 2) + "}").encode()
    path = tmp_path / "dup.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"xy")
    with safe_open(str(path), framework="numpy") as f:
        assert f.get_tensor("a").tolist() == [ord("x"), ord("y")]  # the last one won
    assert json.loads(text) == {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}


def test_its_writer_creates_the_file_with_mode_0o600(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(path))
    assert path.stat().st_mode & 0o777 == 0o600
