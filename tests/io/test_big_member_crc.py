"""Big stored arrays: their CRC is checked on a thread of its own while they are read."""

from __future__ import annotations

import zipfile
from pathlib import Path

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io import _zip
from jaxstruct.io._inspect import verify_report
from jaxstruct.registry import SerializationError

BIG = (_zip._OVERLAP_CRC // 4) + 12345  # float32 elements: just over the threshold


def _flip_byte_inside(path: Path, member: str, at: int) -> None:
    """Flip one byte of ``member``'s data (stored) inside the zip file ``path``."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    with open(path, "r+b") as handle:
        handle.seek(info.header_offset + 26)
        name_len = int.from_bytes(handle.read(2), "little")
        extra_len = int.from_bytes(handle.read(2), "little")
        where = info.header_offset + 30 + name_len + extra_len + at
        handle.seek(where)
        byte = handle.read(1)
        handle.seek(where)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("name", ["ck", "ck.zip"])
def test_big_member_loads_and_checks(name: str, tmp_path: Path) -> None:
    """An intact big array loads exactly; a flipped byte in its middle is a CRC error."""
    data = {"w": np.arange(BIG, dtype=np.float32), "small": np.ones(3)}
    path = jio.export(data, tmp_path / name, compression="none")
    back = jio.load(path)
    np.testing.assert_array_equal(back["w"], data["w"])
    if path.is_dir():
        _flip_byte_inside(path / "arrays.npz", "a0.npy", 4 * BIG // 2)
        with pytest.raises(SerializationError, match="CRC mismatch"):
            jio.load(path)
        assert any("CRC" in problem for problem in verify_report(path)[0])
    else:
        # The .zip nests arrays.npz stored: flip a byte of the outer file inside the array.
        raw = bytearray(path.read_bytes())
        marker = np.arange(BIG, dtype=np.float32)[BIG // 2 : BIG // 2 + 4].tobytes()
        at = raw.index(marker)
        raw[at] ^= 0xFF
        path.write_bytes(bytes(raw))
        with pytest.raises(SerializationError, match="CRC mismatch"):
            jio.load(path)


def test_two_big_members_read_one_after_another_keep_their_own_crc(tmp_path: Path) -> None:
    """Pieces of different members go through the one CRC thread without mixing."""
    data = {"a": np.arange(BIG, dtype=np.float32), "b": -np.arange(BIG, dtype=np.float32)}
    path = jio.export(data, tmp_path / "two.zip", compression="none")
    back = jio.load(path)
    np.testing.assert_array_equal(back["a"], data["a"])
    np.testing.assert_array_equal(back["b"], data["b"])


def test_deferred_crc_check_names_the_corrupt_member(tmp_path: Path) -> None:
    """The CRC of a big member is checked after later members are read; the error still names
    the member whose bytes are wrong, and nothing of the load is returned."""
    data = {"a": np.arange(BIG, dtype=np.float32), "b": -np.arange(BIG, dtype=np.float32)}
    path = jio.export(data, tmp_path / "ck", compression="none")
    _flip_byte_inside(path / "arrays.npz", "a0.npy", 4 * BIG // 3)
    with pytest.raises(SerializationError, match=r"'a0\.npy'.*CRC mismatch"):
        jio.load(path)
