"""An export starts the disk writes of its file while writing it, so its fsync waits for little."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
import safetensors
from jaxstruct.safetensors import _write, _writeback

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range")


@linux
def test_sync_file_range_is_found_and_accepts_a_file_open_for_reading(tmp_path: Path) -> None:
    fn = _writeback._sync_file_range()
    assert fn is not None
    path = tmp_path / "f"
    path.write_bytes(b"x" * 8192)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert fn(fd, 0, 0, _writeback._SYNC_FILE_RANGE_WRITE) == 0
    finally:
        os.close(fd)


def _started(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[str]:
    """Record the file each ``start_writeback`` call of ``module`` is for."""
    started: list[str] = []

    def spy(fd: int) -> None:
        started.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(module, "start_writeback", spy)
    return started


@linux
def test_the_library_writers_file_is_written_back_while_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _started(monkeypatch, _writeback)
    real = safetensors.serialize_file

    def slow(specs: dict, filename: Any, metadata: Any = None) -> None:
        real(specs, filename, metadata=metadata)
        time.sleep(10 * _writeback.INTERVAL_S)  # still writing, for the watcher

    monkeypatch.setattr(safetensors, "serialize_file", slow)
    path = jio.export({"w": np.ones(1024)}, tmp_path / "w.safetensors")
    assert started
    assert all(".w.safetensors.jaxstruct-tmp-" in name for name in started)
    assert jio.load(path)["w"].tolist() == [1.0] * 1024
    count = len(started)
    time.sleep(3 * _writeback.INTERVAL_S)
    assert len(started) == count  # the watcher stopped with the write


@linux
def test_the_tensor_by_tensor_writer_starts_writeback_as_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_write, "COPY_BUDGET", -1)
    monkeypatch.setattr(_write, "WRITEBACK_BYTES", 4096)
    started = _started(monkeypatch, _write)
    state = {f"t{i}": np.full(1024, i, np.float32) for i in range(5)}  # 4 KiB each
    path = jio.export(state, tmp_path / "t.safetensors")
    assert len(started) == 5
    assert jio.load(path)["t3"].tolist() == [3.0] * 1024
