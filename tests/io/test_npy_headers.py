"""Array members' .npy headers: read by numpy.lib.format, bounded, never evaluated as code."""

from __future__ import annotations

from pathlib import Path

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.registry import SerializationError


def test_members_numpy_wrote_load(tmp_path: Path) -> None:
    """arrays.npz written by np.savez (its own header, Fortran order) loads like our own."""
    fortran = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    path = jio.export({"f": np.zeros((3, 4))}, tmp_path / "ck")
    (path / "arrays.npz").unlink()
    with open(path / "arrays.npz", "wb") as handle:
        np.savez(handle, a0=fortran)
    got = jio.load(path)["f"]
    assert np.array_equal(got, fortran) and got.flags.f_contiguous


def test_header_with_code_is_refused_without_running_it(tmp_path: Path) -> None:
    """A header whose dict holds an expression is a SerializationError; nothing is called."""
    path = jio.export({"w": np.zeros(4, np.float32)}, tmp_path / "ck", compression="none")
    data = (path / "arrays.npz").read_bytes()
    start = data.index(b"{'descr'")
    end = data.index(b"}", start) + 1
    evil = b"{'descr': abort(), 'fortran_order': False, 'shape': (4,)}"
    assert len(evil) <= end - start
    (path / "arrays.npz").write_bytes(data[:start] + evil.ljust(end - start) + data[end:])
    with pytest.raises(SerializationError, match=r"member 'a0\.npy': malformed \.npy header"):
        jio.load(path)
