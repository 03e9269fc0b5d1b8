"""No single flipped bit of a ``format="orbax"`` checkpoint's metadata switches its checks off."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import jax
import jaxstruct.io as jio
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io import Limits
from jaxstruct.io._inspect import verify_report
from jaxstruct.orbax import OrbaxFormat, _format, _orbax_internals
from jaxstruct.orbax._stores import committed
from jaxstruct.registry import SerializationError

from ._reseal import manifest_version_1, reseal

# 8 KiB of float32: stored out of line (OCDBT keeps values under 1 KiB in its tree nodes,
# whose own CRC-32Cs would find a flipped byte before the format's checks do).
W = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)

#: jaxstruct's own JSON items of a checkpoint: every load reads them, and nothing else
#: outside the arrays item.
ITEMS = ("jaxstruct_storage/metadata", "jaxstruct_checksums_0/metadata", "jaxstruct/metadata")


def _value() -> dict[str, Any]:
    return {"w": W, "b": np.arange(7, dtype=np.int16), "tag": "model"}


def _same(got: dict[str, Any]) -> bool:
    return (
        got["tag"] == "model"
        and np.array_equal(np.asarray(got["w"]), W)
        and np.array_equal(np.asarray(got["b"]), _value()["b"])
    )


def _targets() -> list[Any]:
    """NumPy, the stored layout (one shard), and shards that cut the stored unit."""
    mesh = jax.make_mesh((4, 2), ("a", "b"))
    out: list[Any] = [None]
    for spec in (P(), P("a", "b")):
        sharding = NamedSharding(mesh, spec)
        out.append(
            {
                "w": jax.ShapeDtypeStruct(W.shape, W.dtype, sharding=sharding),
                "b": jax.ShapeDtypeStruct((7,), np.int16, sharding=NamedSharding(mesh, P())),
                "tag": "model",
            }
        )
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint (one per worker); tests work on copies of it."""
    return jio.export(_value(), tmp_path_factory.mktemp("marks") / "ck", format="orbax")


@pytest.fixture
def copy(saved: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "ck"))


def _flip_data(path: Path) -> tuple[Path, int]:
    """Flip one bit in the middle of ``w``'s stored bytes; return where (to flip it back)."""
    for file in (path / "arrays").rglob("*"):
        if not file.is_file():
            continue
        blob = bytearray(file.read_bytes())
        at = blob.find(W.tobytes())
        if at >= 0:
            blob[at + W.nbytes // 2] ^= 1
            file.write_bytes(blob)
            return file, at + W.nbytes // 2
    raise AssertionError("w's bytes are not stored as they are")


def _unflip(where: tuple[Path, int]) -> None:
    file, at = where
    blob = bytearray(file.read_bytes())
    blob[at] ^= 1
    file.write_bytes(blob)


def _poke(file: Path, at: int, byte: int) -> None:
    """Write one byte in place (no truncation: ext4 writes a truncated file's data out when
    it is closed, 3 ms a time here)."""
    fd = os.open(file, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes([byte]), at)
    finally:
        os.close(fd)


def _opened(path: Path) -> Any:
    opened = OrbaxFormat().open(path, Limits())
    opened.close()
    return opened


@pytest.mark.parametrize("item", ITEMS)
def test_no_flipped_bit_of_jaxstructs_items_loads_wrong_data_or_unchecked(
    item: str, copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every single bit of the storage item, the checksum record and the manifest item
    flipped, with one bit of ``w``'s stored bytes: every load raises our error naming the
    checkpoint and what to do. Where it is the data's checksum that fails, the flip alone
    opens with every check on, and loads the value or raises."""
    # orbax's "is this a finished checkpoint" looks at the directory's name, never at the
    # bytes of a file: asked once (it costs 3 ms a call), not once per flip.
    assert committed(copy)
    monkeypatch.setattr(_format, "committed", lambda p: True)
    data = _flip_data(copy)
    file = copy / item
    pristine = file.read_bytes()
    refused, checked, silent = [], [], []
    for bit in range(len(pristine) * 8):
        _poke(file, bit // 8, pristine[bit // 8] ^ 1 << bit % 8)
        try:
            jio.load(copy)
            silent.append(bit)
        except SerializationError as err:
            assert str(copy) in str(err) and "from a copy" in str(err), err
            found = "array 'w', stored region [0:64, 0:32], does not match" in str(err)
            (checked if found else refused).append(bit)
        _poke(file, bit // 8, pristine[bit // 8])
    _unflip(data)
    for bit in checked:  # the item's flip alone: opens checked, loads the value or raises
        _poke(file, bit // 8, pristine[bit // 8] ^ 1 << bit % 8)
        assert _opened(copy).arrays_checked, bit
        try:
            assert _same(jio.load(copy)), bit
        except SerializationError as err:
            assert "does not match its checksum" in str(err), err
        _poke(file, bit // 8, pristine[bit // 8])
    assert silent == [] and len(refused) + len(checked) == len(pristine) * 8 and refused


def test_a_load_reads_no_file_of_orbaxs_own_but_the_arrays(copy: Path) -> None:
    """Of a checkpoint's files, a load opens (from Python) only jaxstruct's three items;
    orbax's ``_CHECKPOINT_METADATA``, ``_METADATA`` and commit markers are not read, and
    tensorstore reads only the OCDBT database under ``arrays/``."""
    jio.load(copy, target=_targets()[2])  # warm: every import and compilation done
    opened: set[str] = set()
    root = [str(copy) + os.sep]  # emptied after the loads: the hook stays, idle

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and root and isinstance(args[0], str | bytes | os.PathLike):
            name = os.fsdecode(args[0])
            if name.startswith(root[0]):
                opened.add(name[len(root[0]) :])

    sys.addaudithook(hook)  # (audit hooks cannot be removed: this one stops collecting)
    try:
        for target in _targets():
            assert _same(jio.load(copy, target=target))
    finally:
        root.clear()
    assert opened == set(ITEMS)


def test_orbaxs_own_metadata_files_decide_nothing(copy: Path) -> None:
    """``_CHECKPOINT_METADATA``, ``arrays/_METADATA`` and every ``commit_success.txt``
    overwritten with bytes that are no JSON at all: every load gives the value with its
    checks on, and finds a flipped data bit. (So no flipped bit of theirs can matter.)"""
    junk = [copy / "_CHECKPOINT_METADATA", copy / "arrays" / "_METADATA"]
    junk += list(copy.rglob("commit_success.txt"))
    assert len(junk) == 7
    for file in junk:
        file.write_bytes(bytes(b ^ 0x5A for b in file.read_bytes()))
    assert _opened(copy).arrays_checked
    for target in _targets():
        assert _same(jio.load(copy, target=target))
    _flip_data(copy)
    for target in _targets():
        with pytest.raises(SerializationError, match="array 'w', stored region"):
            jio.load(copy, target=target)


def _storage(path: Path) -> tuple[Path, str]:
    file = path / "jaxstruct_storage" / "metadata"
    return file, file.read_text()


def test_each_one_bit_rename_of_the_storage_items_crc32_is_refused(copy: Path) -> None:
    """The attack of issue 45: one flipped bit in the storage item's key ``"crc32"`` no
    longer makes the checkpoint one written before checksums; each rename is refused,
    saying why and what to do."""
    file, text = _storage(copy)
    key = text.rindex('"crc32": ') + 1  # the item's own (``"units": "crc32"`` comes first)
    refused = 0
    for at in range(key, key + 5):
        for bit in range(7):
            new = chr(ord(text[at]) ^ 1 << bit)
            if new in '"\\' or not new.isprintable():
                continue  # the item is no JSON any more
            file.write_text(text[:at] + new + text[at + 1 :])
            with pytest.raises(SerializationError, match=r"'crc32'.*missing or renamed") as info:
                jio.load(copy)
            assert str(copy) in str(info.value) and "from a copy" in str(info.value)
            refused += 1
    assert refused == 32  # issue 45 counted these 32 flips


@pytest.mark.parametrize("key", ["manifest_crc32", "checksums"])
def test_a_renamed_mark_is_found_by_the_storage_items_crc32(key: str, copy: Path) -> None:
    """The other marks renamed by one bit: the item's own CRC-32 (over its keys) refuses it."""
    file, text = _storage(copy)
    file.write_text(text.replace(f'"{key}"', f'"{key[:-1]}{chr(ord(key[-1]) ^ 1)}"'))
    with pytest.raises(SerializationError, match="storage item does not match its checksum"):
        jio.load(copy)


def test_a_checkpoint_without_checksums_or_marks_loads_unchecked(copy: Path) -> None:
    """A checkpoint of jaxstruct-orbax before checksums (no CRC in its storage item, no
    record) still loads, opens unchecked, and inspect says so."""
    file, text = _storage(copy)
    document = json.loads(text)
    for key in ("crc32", "manifest_crc32", "checksums"):
        del document[key]
    file.write_text(json.dumps(document))
    shutil.rmtree(copy / "jaxstruct_checksums_0")
    manifest_version_1(copy)
    for target in _targets():
        assert _same(jio.load(copy, target=target))
    assert _opened(copy).arrays_checked is False
    assert jio.inspect(copy).checksums == "none: written by jaxstruct-orbax before checksums"
    assert verify_report(copy) == ([], False)


def _as_version_01(path: Path) -> None:
    """Make ``path``'s storage item that of jaxstruct-orbax 0.1 (chunks with zarr's crc32c
    codec, no records), sealed again."""
    file, text = _storage(path)
    document = json.loads(text)
    del document["checksums"]
    document["chunks"] = "crc32c"
    file.write_text(json.dumps(document))
    reseal(path)
    shutil.rmtree(path / "jaxstruct_checksums_0")


def test_a_checkpoint_of_version_01_opens_checked_by_its_chunk_codec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A jaxstruct-orbax 0.1 checkpoint (a CRC-32C in every chunk) opens with its checks on
    and loads every way; as NumPy too, through jaxstruct's reader, which checks the codec."""
    monkeypatch.setattr(_orbax_internals, "_CHUNK_CRC", True)
    path = jio.export(_value(), tmp_path / "ck", format="orbax")
    _as_version_01(path)
    assert _opened(path).arrays_checked
    for target in _targets():
        assert _same(jio.load(path, target=target))
    _flip_data(path)
    for target in _targets():
        with pytest.raises(SerializationError, match="does not match its checksum"):
            jio.load(path, target=target)


def test_a_version_01_storage_item_over_chunks_without_crc32c_is_refused(copy: Path) -> None:
    """A storage item that promises crc32c chunks over chunks that carry none: every load
    is refused, naming the array (tensorstore would check nothing)."""
    _as_version_01(copy)
    for target in _targets():
        with pytest.raises(SerializationError, match="'w' is stored without the crc32c codec"):
            jio.load(copy, target=target)


def test_a_plain_orbax_checkpoint_still_loads_unchecked(tmp_path: Path) -> None:
    """A fresh ``StandardCheckpointer`` checkpoint loads into a target, opens unchecked, and
    inspect and verify say jaxstruct checked nothing."""
    path = (tmp_path / "plain").absolute()
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, {"w": W})
    checkpointer.wait_until_finished()
    checkpointer.close()
    got = jio.load(path, target={"w": np.zeros_like(W)})
    assert np.array_equal(got["w"], W)
    assert _opened(path).arrays_checked is False
    assert jio.inspect(path).checksums.startswith("none checked by jaxstruct")
    assert verify_report(path) == ([], False)


def test_the_format_says_it_checks_its_arrays() -> None:
    """``format="orbax"`` declares that it checks every stored byte itself."""
    assert OrbaxFormat.checks_arrays is True
