"""No single flipped bit of a safetensors header jaxstruct wrote switches its checks off."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import jaxstruct.io as jio
import numpy as np
import pytest
import safetensors.flax
import safetensors.numpy
from jaxstruct.io import Limits
from jaxstruct.io._inspect import verify_report
from jaxstruct.registry import SerializationError
from jaxstruct.safetensors import SafetensorsFormat
from jaxstruct.safetensors._checksums import CHECKSUMS_KEY, MARK_KEY, header_crc
from jaxstruct.safetensors._header import dtype_of, encode_header, read_header

from ._older import older

HALVES = 2  # the sweep in parts, so that pytest-xdist runs them side by side


def _value() -> dict[str, Any]:
    return {
        "w": np.arange(24 * 10, dtype=np.float32).reshape(24, 10),
        "b": np.arange(7, dtype=np.int16),
        "tag": "model",
    }


def _same(got: dict[str, Any]) -> bool:
    want = _value()
    return (
        got["tag"] == want["tag"]
        and np.array_equal(got["w"], want["w"])
        and np.array_equal(got["b"], want["b"])
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a small file jaxstruct wrote (one per worker)."""
    return jio.export(_value(), tmp_path_factory.mktemp("marks") / "x.safetensors").read_bytes()


def _header_bytes(blob: bytes) -> int:
    """How many bytes the 8-byte length and the JSON header take."""
    return 8 + struct.unpack("<Q", blob[:8])[0]


def _poke(file: Path, at: int, byte: int) -> None:
    """Write one byte in place (no truncation: ext4 writes a truncated file's data out when
    it is closed, 3 ms a time here)."""
    fd = os.open(file, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes([byte]), at)
    finally:
        os.close(fd)


def _opened(path: Path) -> Any:
    """The format's opened checkpoint of ``path`` (its header read and checked)."""
    return SafetensorsFormat().open(path, Limits())


@pytest.mark.parametrize("half", range(HALVES))
def test_no_flipped_header_bit_loads_wrong_data_or_unchecked(
    half: int, written: bytes, tmp_path: Path
) -> None:
    """Every single bit of the header (its length, the JSON, ``__metadata__`` included)
    flipped, then one data byte: every load raises our error naming the file and what to do,
    either the header's own or the data byte found by the checks. Where the checks found
    it, the header flip alone opens with every check on, and loads the value or raises."""
    end = _header_bytes(written)
    data_byte = end + (len(written) - end) // 2
    path = tmp_path / "bad.safetensors"
    path.write_bytes(written)
    _poke(path, data_byte, written[data_byte] ^ 1)
    refused, checked, silent = [], [], []
    bits = range(half * end * 8 // HALVES, (half + 1) * end * 8 // HALVES)
    for bit in bits:
        _poke(path, bit // 8, written[bit // 8] ^ 1 << bit % 8)
        try:
            jio.load(path)
            silent.append(bit)
        except SerializationError as err:
            assert str(path) in str(err) and "restore" in str(err), err
            found = "does not match its checksum (in its data" in str(err)
            (checked if found else refused).append(bit)
        _poke(path, bit // 8, written[bit // 8])
    _poke(path, data_byte, written[data_byte])
    for bit in checked:  # the header flip alone: opens checked, loads the value or raises
        flipped = bytearray(written)
        flipped[bit // 8] ^= 1 << bit % 8
        path.write_bytes(flipped)
        opened = _opened(path)
        opened.close()
        assert opened.arrays_checked, bit
        try:
            assert _same(jio.load(path)), bit
        except SerializationError as err:  # a flipped CRC digit: the data no longer matches
            assert "does not match its checksum" in str(err), err
    assert silent == [] and len(refused) + len(checked) == len(bits) and refused


def _renamed(blob: bytes, old: str, new: str) -> bytes:
    """``blob`` with the metadata key ``old`` renamed ``new`` (same length: data stays put)."""
    assert len(old.encode()) == len(new.encode())
    end = _header_bytes(blob)
    head = blob[:end].replace(f'"{old}"'.encode(), f'"{new}"'.encode(), 1)
    assert head != blob[:end]
    return head + blob[end:]


def test_each_one_bit_rename_of_the_checksums_key_is_refused(
    written: bytes, tmp_path: Path
) -> None:
    """The attack of issue 45: one flipped bit in the key ``jaxstruct.checksums`` no longer
    makes the file an unchecked one; each rename that is still JSON is refused, saying why
    and what to do."""
    path = tmp_path / "x.safetensors"
    refused = 0
    for at, char in enumerate(CHECKSUMS_KEY):
        for bit in range(7):
            new = CHECKSUMS_KEY[:at] + chr(ord(char) ^ 1 << bit) + CHECKSUMS_KEY[at + 1 :]
            if new[at] in '"\\' or not new[at].isprintable():
                continue  # not a key any more: the header is no JSON
            path.write_bytes(_renamed(written, CHECKSUMS_KEY, new))
            with pytest.raises(SerializationError, match="missing or renamed") as info:
                jio.load(path)
            assert str(path) in str(info.value) and "restore the file from a copy" in str(
                info.value
            )
            refused += 1
    assert refused > 100


def _rewritten(blob: bytes, edit: Any) -> bytes:
    """``blob`` with its metadata edited by ``edit(metadata)``, the header's CRC in the
    checksums entry (if any) computed again, and the header re-encoded; data unmoved."""
    end = _header_bytes(blob)
    document = json.loads(blob[8:end])
    metadata = document.pop("__metadata__")
    edit(metadata)
    tensors = sorted(document.items(), key=lambda kv: kv[1]["data_offsets"][0])
    if CHECKSUMS_KEY in metadata:
        entry = json.loads(metadata[CHECKSUMS_KEY])
        layout = [(name, dtype_of(t["dtype"]), t["shape"]) for name, t in tensors]
        entry["header"] = f"{header_crc(metadata, layout):08x}"
        metadata[CHECKSUMS_KEY] = json.dumps(entry, separators=(",", ":"))
    entries = {
        name: (t["dtype"], t["shape"], t["data_offsets"][1] - t["data_offsets"][0])
        for name, t in tensors
    }
    return encode_header(metadata, entries) + blob[end:]


def test_the_mark_without_the_checksums_is_refused(written: bytes, tmp_path: Path) -> None:
    """A file whose ``jaxstruct.checked`` mark is left but whose checksums entry is gone is
    refused: one mark intact demands the checksums."""
    path = tmp_path / "x.safetensors"
    path.write_bytes(_rewritten(written, lambda m: m.pop(CHECKSUMS_KEY)))
    with pytest.raises(SerializationError, match=r"'jaxstruct\.checked'.*missing or renamed"):
        jio.load(path)


def test_a_renamed_mark_is_found_by_the_headers_checksum(written: bytes, tmp_path: Path) -> None:
    """The mark's key renamed by one bit: the checksums are still there, and the header's
    CRC (which covers the mark) refuses the file."""
    path = tmp_path / "x.safetensors"
    path.write_bytes(_renamed(written, MARK_KEY, MARK_KEY[:-1] + "e"))
    with pytest.raises(SerializationError, match="header does not match its checksum"):
        jio.load(path)


def test_a_file_of_the_earlier_writer_with_a_renamed_checksums_key_is_refused(
    written: bytes, tmp_path: Path
) -> None:
    """A file written with checksums but before their mark (no ``jaxstruct.checked``) whose
    checksums key is one bit off is still refused: a key one bit away from a mark is one."""
    path = tmp_path / "x.safetensors"
    earlier = _rewritten(written, lambda m: m.pop(MARK_KEY))
    renamed = _renamed(earlier, CHECKSUMS_KEY, "jaxstruct.checksumr")
    path.write_bytes(renamed)
    with pytest.raises(SerializationError, match=r"'jaxstruct\.checksumr'.*missing or renamed"):
        jio.load(path)


def test_our_file_opens_with_its_checks_on(written: bytes, tmp_path: Path) -> None:
    """The format checks its own arrays, and a file it wrote opens saying so."""
    assert SafetensorsFormat.checks_arrays is True
    path = tmp_path / "x.safetensors"
    path.write_bytes(written)
    with open(path, "rb") as file:
        metadata = read_header(file, Limits(), "x").metadata
    assert {CHECKSUMS_KEY, MARK_KEY} <= set(metadata)
    opened = _opened(path)
    opened.close()
    assert opened.arrays_checked is True


def test_a_file_of_jaxstruct_before_checksums_loads_unchecked(
    written: bytes, tmp_path: Path
) -> None:
    """A file with jaxstruct's manifest but neither the checksums nor their mark (as written
    before them) loads, opens unchecked, and inspect says so."""
    path = tmp_path / "older.safetensors"
    path.write_bytes(_rewritten(written, older))
    assert _same(jio.load(path))
    opened = _opened(path)
    opened.close()
    assert opened.arrays_checked is False
    assert jio.inspect(path).checksums.startswith("none: written by an earlier jaxstruct")
    assert verify_report(path) == ([], False)


def _foreign_numpy(path: Path) -> dict[str, Any]:
    tensors = {"w": np.ones((3, 4), np.float32), "b": np.arange(5, dtype=np.int64)}
    safetensors.numpy.save_file(tensors, str(path), metadata={"format": "np"})
    return tensors


def _foreign_flax(path: Path) -> dict[str, Any]:
    tensors = {"w": jnp.ones((3, 4), jnp.bfloat16), "b": jnp.arange(5, dtype=jnp.int32)}
    safetensors.flax.save_file(tensors, str(path))
    return {k: np.asarray(v) for k, v in tensors.items()}


@pytest.mark.parametrize("save", [_foreign_numpy, _foreign_flax], ids=["numpy", "flax"])
def test_other_tools_files_still_load_unchecked(save: Any, tmp_path: Path) -> None:
    """A fresh file of ``safetensors.numpy`` or ``safetensors.flax`` loads (as a dict and
    into a target), opens unchecked, and inspect and verify say no checksums were checked."""
    path = tmp_path / "theirs.safetensors"
    tensors = save(path)
    got = jio.load(path)
    assert sorted(got) == sorted(tensors)
    assert all(np.array_equal(got[k], v) for k, v in tensors.items())
    target = {k: np.zeros(v.shape, v.dtype) for k, v in tensors.items()}
    assert np.array_equal(jio.load(path, target=target)["w"], tensors["w"])
    opened = _opened(path)
    opened.close()
    assert opened.arrays_checked is False
    assert jio.inspect(path).checksums == "none: written by another tool"
    assert verify_report(path) == ([], False)
