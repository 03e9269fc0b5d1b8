"""The specification's layout: parents made, a zip of the directory's two files, zero-copy."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io._builtin import DirectoryFormat, ZipFormat
from jaxstruct.io._schema import Limits, check_arrays_table, parse_manifest
from jaxstruct.registry import SerializationError


def test_export_creates_missing_parent_directories(tmp_path: Path) -> None:
    """export("checkpoints/step_100") makes the missing folders first."""
    path = jio.export({"w": np.ones(3)}, tmp_path / "checkpoints" / "run" / "step_100")
    assert jio.load(path)["w"].tolist() == [1, 1, 1]


def test_zip_holds_exactly_manifest_and_arrays_npz(tmp_path: Path) -> None:
    """A .zip checkpoint's members are manifest.json and arrays.npz, the latter stored."""
    path = jio.export({"w": np.arange(5.0)}, tmp_path / "ck.zip")
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        assert [i.filename for i in infos] == ["manifest.json", "arrays.npz"]
        assert infos[1].compress_type == zipfile.ZIP_STORED
        assert archive.testzip() is None  # every CRC, the outer one of arrays.npz included


def test_unzipped_zip_is_a_directory_checkpoint(tmp_path: Path) -> None:
    """Unzipping a .zip checkpoint gives a directory checkpoint that loads to the same value."""
    value = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": 3, "z": np.zeros(10_000)}
    path = jio.export(value, tmp_path / "ck.zip", compression="deflate")
    with zipfile.ZipFile(path) as archive:
        archive.extractall(tmp_path / "unzipped")
    back = jio.load(tmp_path / "unzipped")
    assert back["n"] == 3
    np.testing.assert_array_equal(back["w"], value["w"])
    np.testing.assert_array_equal(back["z"], value["z"])


def test_numpy_reads_arrays_npz_of_the_zip(tmp_path: Path) -> None:
    """numpy.load(allow_pickle=False) reads the arrays.npz member of a .zip checkpoint."""
    path = jio.export({"w": np.arange(4.0)}, tmp_path / "ck.zip")
    with zipfile.ZipFile(path) as archive:
        data = archive.read("arrays.npz")
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        np.testing.assert_array_equal(npz["a0"], np.arange(4.0))


def test_zip_with_deflated_arrays_npz_is_refused(tmp_path: Path) -> None:
    """A zip whose arrays.npz member was recompressed is refused with the fix in the message."""
    path = jio.export({"w": np.arange(4.0)}, tmp_path / "ck.zip")
    with zipfile.ZipFile(path) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(SerializationError, match="must be stored"):
        jio.load(bad)


@pytest.mark.parametrize("fmt", [DirectoryFormat(), ZipFormat()], ids=["directory", "zip"])
def test_arrays_are_read_into_aligned_buffers_jax_adopts(fmt: object, tmp_path: Path) -> None:
    """read_arrays returns 64-byte-aligned host arrays that jax.device_put takes without a copy."""
    suffix = ".zip" if isinstance(fmt, ZipFormat) else ""
    path = jio.export({f"w{i}": jnp.arange(1000.0) + i for i in range(3)}, tmp_path / f"ck{suffix}")
    opened = fmt.open(path, Limits())  # type: ignore[attr-defined]
    try:
        top = parse_manifest(opened.manifest, "x")
        arrays = opened.read_arrays(check_arrays_table(top["arrays"], "x", Limits()))
    finally:
        opened.close()
    for arr in arrays.values():
        assert arr.ctypes.data % 64 == 0
        placed = jax.device_put(arr, jax.devices()[0])
        assert placed.unsafe_buffer_pointer() == arr.ctypes.data


def test_loaded_jax_arrays_sit_in_aligned_buffers(tmp_path: Path) -> None:
    """load returns JAX arrays whose buffers are the aligned ones read from disk."""
    path = jio.export({"w": jnp.arange(4096.0)}, tmp_path / "ck")
    w = jio.load(path)["w"]
    assert isinstance(w, jax.Array)
    assert w.unsafe_buffer_pointer() % 64 == 0
    assert w.tolist() == list(range(4096))


def test_auto_stores_random_jax_arrays(tmp_path: Path) -> None:
    """compression="auto" samples a JAX array's data, not its header: random floats are stored."""
    rng = np.random.default_rng(0)
    value = {"w": jnp.asarray(rng.standard_normal(1 << 16, dtype=np.float32))}
    path = jio.export(value, tmp_path / "ck")
    with zipfile.ZipFile(path / "arrays.npz") as npz:
        assert [i.compress_type for i in npz.infolist()] == [zipfile.ZIP_STORED]


def test_a_byte_flipped_in_a_directory_manifest_string_fails_the_load(tmp_path: Path) -> None:
    """One byte changed inside a string of manifest.json (still valid JSON, a static value)
    fails load and inspect with our error naming the file; the manifest's checksum is its
    last JSON member, so any JSON reader still reads the file."""
    import json

    path = jio.export({"w": np.ones(2), "name": "hello"}, tmp_path / "ck")
    raw = (path / "manifest.json").read_bytes()
    assert json.loads(raw)["checksum"].startswith("crc32:")
    at = raw.index(b'"hello"') + 1
    (path / "manifest.json").write_bytes(raw[:at] + b"j" + raw[at + 1 :])
    json.loads((path / "manifest.json").read_bytes())  # still valid JSON
    for attempt in (jio.load, jio.inspect):
        with pytest.raises(SerializationError, match=r"manifest\.json does not match its checksum"):
            attempt(path)
    # An overwrite may still replace the damaged checkpoint (it is ours).
    jio.export({"w": np.zeros(1)}, path, overwrite=True)
    assert jio.load(path)["w"].tolist() == [0.0]


def test_a_directory_manifest_without_a_checksum_still_loads(tmp_path: Path) -> None:
    """A manifest.json written before checksums (or unzipped from a .zip) is read as it is."""
    zipped = jio.export({"w": np.ones(2)}, tmp_path / "a.zip")
    unzipped = tmp_path / "a"
    with zipfile.ZipFile(zipped) as archive:
        archive.extractall(unzipped)
    assert b'"checksum":' not in (unzipped / "manifest.json").read_bytes()
    assert jio.load(unzipped)["w"].tolist() == [1.0, 1.0]
