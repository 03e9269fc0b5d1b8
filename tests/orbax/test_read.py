"""How the orbax format stores and reads arrays: chunked blocks, any target sharding, dtypes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.orbax import _format, _read
from jaxstruct.registry import SerializationError

from ._reseal import manifest_version_1, reseal


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of at most 1 KiB and blocks of 2 KiB: every array spans many blocks."""
    monkeypatch.setattr(_format, "DATA_FILE_BYTES", 1024)
    monkeypatch.setattr(_read, "BLOCK_BYTES", 2048)


def _values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((64, 24)).astype(np.float32),
        "bf16": rng.standard_normal((16, 8, 6)).astype(ml_dtypes.bfloat16),
        "flags": rng.random((40, 8)) > 0.5,
        "i16": np.arange(8 * 32, dtype=np.int16).reshape(8, 32),
    }


SPECS = {
    "rows": ((8,), ("x",), P("x")),
    "columns": ((8,), ("x",), P(None, "x")),
    "grid": ((2, 4), ("a", "b"), P("b", "a")),
    "replicated": ((8,), ("x",), P()),
    "half-replicated": ((2, 4), ("a", "b"), P("a")),
}


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_restores_every_dtype_into_every_sharding(
    tmp_path: Path, small_blocks: None, spec: str
) -> None:
    """Values saved sharded by rows come back exact in any target sharding, block by block."""
    shape, names, pspec = SPECS[spec]
    mesh = jax.make_mesh(shape, names)
    values = _values()
    rows = NamedSharding(jax.make_mesh((8,), ("x",)), P("x"))
    saved = {k: jax.device_put(v, rows) for k, v in values.items()}
    path = jio.export(saved, tmp_path / "ck", format="orbax")
    sharding = NamedSharding(mesh, pspec)
    target = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in values.items()
    }
    back = jio.load(path, target=target)
    for key, value in values.items():
        assert back[key].sharding == sharding
        assert back[key].dtype == value.dtype
        np.testing.assert_array_equal(np.asarray(back[key]), value)


def _resharded_roundtrip(tmp_path: Path, spec: str) -> None:
    """Save the values sharded by rows, restore them in ``spec``'s sharding, compare exactly."""
    shape, names, pspec = SPECS[spec]
    values = _values()
    rows = NamedSharding(jax.make_mesh((8,), ("x",)), P("x"))
    path = jio.export(
        {k: jax.device_put(v, rows) for k, v in values.items()}, tmp_path / "ck", format="orbax"
    )
    sharding = NamedSharding(jax.make_mesh(shape, names), pspec)
    target = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in values.items()
    }
    back = jio.load(path, target=target)
    for key, value in values.items():
        assert back[key].sharding == sharding
        np.testing.assert_array_equal(np.asarray(back[key]), value)


@pytest.mark.parametrize("spec", ["columns", "grid", "half-replicated"])
def test_chunks_larger_than_a_block_are_read_once_and_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    """Stored chunks bigger than a block (old checkpoints): read whole, then split exactly."""
    monkeypatch.setattr(_read, "BLOCK_BYTES", 64)
    _resharded_roundtrip(tmp_path, spec)


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_the_object_store_pace_restores_every_sharding(
    tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    """Read as from an object store (eight blocks in flight, no chunk cache): a block that
    feeds several shards is read once and copied, and every value comes back exact."""
    pace = _read.Pace(2048, _read.STORE_IN_FLIGHT, cached=False)
    monkeypatch.setattr(_read.Pace, "of", classmethod(lambda cls, total, remote: pace))
    _resharded_roundtrip(tmp_path, spec)


def test_object_stores_get_data_files_of_one_block() -> None:
    """Saved to a bucket, data files (and chunks) are the size a restore reads at once, from
    the arrays' global sizes; local checkpoints keep ``DATA_FILE_BYTES``."""
    arrays = {"a": np.zeros((1024, 1024), np.float32), "b": np.zeros(1 << 18, np.float64)}
    total = 4 * (1 << 20) + 8 * (1 << 18)
    assert _format._data_file_bytes("s3://bucket/run", arrays) == _read.block_bytes(total)
    assert _format._data_file_bytes("gs://bucket/run", arrays) == _read.block_bytes(total)
    assert _format._data_file_bytes(Path("/tmp/run"), arrays) == _format.DATA_FILE_BYTES
    # Chunks: a bucket's are its data files; local ones are small, each checked cheaply.
    block = _read.block_bytes(total)
    assert _format._sizes("s3://bucket/run", arrays) == (block, block)
    assert _format._sizes(Path("/tmp/run"), arrays) == (_format.DATA_FILE_BYTES, 4 << 20)


def test_local_chunks_are_at_most_chunk_bytes(tmp_path: Path) -> None:
    """A 16 MiB array saved locally is stored in chunks of at most 4 MiB."""
    path = jio.export({"w": np.zeros((2048, 2048), np.float32)}, tmp_path / "ck", format="orbax")
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{path / 'arrays'}/"}).result()
    chunk = next(k for k in kv.list().result() if k.endswith(b"zarr.json"))
    grid = json.loads(kv.read(chunk).result().value)["chunk_grid"]["configuration"]["chunk_shape"]
    assert 0 < grid[0] * grid[1] * 4 <= 4 << 20


def test_partial_restore_mixes_devices_and_host(tmp_path: Path, small_blocks: None) -> None:
    """Some arrays into shardings, one as NumPy, one left out: each comes back as asked."""
    values = _values()
    path = jio.export(values, tmp_path / "ck", format="orbax")
    sharding = NamedSharding(jax.make_mesh((8,), ("x",)), P("x"))
    target = {
        "f32": jax.ShapeDtypeStruct((64, 24), np.float32, sharding=sharding),
        "bf16": None,
        "flags": jax.ShapeDtypeStruct((40, 8), np.bool_, sharding=sharding),
        "i16": None,
    }
    back = jio.load(path, target=target, select=lambda t: {"f32": t["f32"], "bf16": t["bf16"]})
    assert set(back) == {"f32", "bf16"}
    assert isinstance(back["bf16"], np.ndarray)
    np.testing.assert_array_equal(np.asarray(back["f32"]), values["f32"])
    np.testing.assert_array_equal(back["bf16"], values["bf16"])


def test_checkpoints_with_orbax_default_chunks_still_load(tmp_path: Path) -> None:
    """A checkpoint written with orbax's own defaults (whole-shard compressed chunks) loads,
    and so does the layout of checkpoints written before arrays were stored by tree path
    (a flat ``{a0: ...}`` tree, and no names in the storage item)."""
    path = jio.export({"w": np.zeros(1, np.float32)}, tmp_path / "ck", format="orbax")
    storage = path / "jaxstruct_storage" / "metadata"
    document = json.loads(storage.read_text())
    assert document.pop("names") == {"a0": "w"}
    storage.write_text(json.dumps(document))
    data = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    w = jax.device_put(data, NamedSharding(jax.make_mesh((8,), ("x",)), P("x")))
    shutil.rmtree(path / "arrays")
    checkpointer = ocp.PyTreeCheckpointer()
    checkpointer.save(path / "arrays", {"a0": w})
    checkpointer.close()
    edited = (
        (path / "jaxstruct" / "metadata").read_text().replace('"shape": [1]', '"shape": [64, 16]')
    )
    sealed = json.loads(jio.seal_manifest(json.loads(edited)))  # edited on purpose
    (path / "jaxstruct" / "metadata").write_text(json.dumps(sealed))
    document = json.loads(storage.read_text())
    for key in ("checksums", "manifest_crc32", "crc32"):  # those checkpoints had no checksums
        del document[key]
    storage.write_text(json.dumps(document))
    manifest_version_1(path)
    sharding = NamedSharding(jax.make_mesh((2, 4), ("a", "b")), P(None, ("a", "b")))
    target = {"w": jax.ShapeDtypeStruct((64, 16), np.float32, sharding=sharding)}
    np.testing.assert_array_equal(np.asarray(jio.load(path, target=target)["w"]), data)


def _arrays_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in (path / "arrays").rglob("*") if f.is_file())


def test_compression_is_zstd_only_when_asked(tmp_path: Path) -> None:
    """``compression="deflate"`` compresses the chunks; the default stores them as they are."""
    data = {"w": jnp.zeros((256, 256), jnp.float32) + jnp.arange(256, dtype=jnp.float32)}
    plain = jio.export(data, tmp_path / "plain", format="orbax")
    packed = jio.export(data, tmp_path / "packed", format="orbax", compression="deflate")
    assert _arrays_bytes(plain) > 256 * 256 * 4
    assert _arrays_bytes(packed) < 256 * 256 * 4 // 4
    for path in (plain, packed):
        np.testing.assert_array_equal(np.asarray(jio.load(path)["w"]), np.asarray(data["w"]))


def test_missing_array_data_is_a_serialization_error(tmp_path: Path) -> None:
    """Chunk data deleted under the checkpoint: a SerializationError, never zeros."""
    sharding = NamedSharding(jax.make_mesh((8,), ("x",)), P("x"))
    data = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    path = jio.export({"w": jax.device_put(data, sharding)}, tmp_path / "ck", format="orbax")
    data_files = [f for f in (path / "arrays").rglob("d/*") if f.stat().st_size >= 8 * 64 * 4]
    assert data_files
    for file in data_files:
        file.unlink()
    target = {"w": jax.ShapeDtypeStruct((256, 64), np.float32, sharding=sharding)}
    with pytest.raises(SerializationError, match="could not read the arrays"):
        jio.load(path, target=target)


def test_store_blocks_are_a_128th_of_the_data_within_2_and_32_mib() -> None:
    """From object stores, the blocks in flight grow with the data, not beyond 1/16 of it;
    local files keep the largest blocks and the shared chunk cache."""
    mib = 1 << 20
    assert _read.block_bytes(1024) == 2 * mib
    assert _read.block_bytes(256 * mib) == 2 * mib
    assert _read.block_bytes(1024 * mib) == 8 * mib
    assert _read.block_bytes(8192 * mib) == 32 * mib
    remote = _read.Pace.of(1024 * mib, remote=True)
    assert (remote.block, remote.in_flight, remote.cache) == (8 * mib, _read.STORE_IN_FLIGHT, 0)
    assert remote.in_flight * remote.block == 1024 * mib // 16
    local = _read.Pace.of(1024 * mib, remote=False)
    assert local.block == _read.BLOCK_BYTES
    assert local.cache == (_read.IN_FLIGHT + 1) * _read.BLOCK_BYTES


@pytest.mark.parametrize("name", ["../../outside", "a..b", "", "a/b", ".", "w\x00"])
def test_array_names_from_the_file_are_checked(tmp_path: Path, name: str) -> None:
    """A storage item naming an array outside the arrays item (or not as a tree path) is
    refused before orbax opens anything."""
    path = jio.export({"w": np.arange(4.0)}, tmp_path / "ck", format="orbax")
    storage = path / "jaxstruct_storage" / "metadata"
    document = json.loads(storage.read_text())
    document["names"] = {"a0": name}
    storage.write_text(json.dumps(document))
    reseal(path)
    with pytest.raises(SerializationError, match="malformed names"):
        jio.load(path)


def test_paths_that_cannot_nest_keep_flat_keys(tmp_path: Path) -> None:
    """A dict key that makes a path step orbax cannot name a directory by (a backslash)
    leaves the arrays item keyed by the manifest's keys; the checkpoint loads the same."""
    value = {"a": {"x\\y": np.arange(3.0)}, "w": np.ones(2, np.int32)}
    path = jio.export(value, tmp_path / "ck", format="orbax")
    assert "names" not in json.loads((path / "jaxstruct_storage" / "metadata").read_text())
    back = jio.load(path)
    np.testing.assert_array_equal(back["a"]["x\\y"], value["a"]["x\\y"])
    np.testing.assert_array_equal(back["w"], value["w"])


def test_an_empty_dict_key_is_a_step_of_its_own(tmp_path: Path) -> None:
    """The dict key "" is the path step '%' (tree paths keep every step), so the arrays
    item nests it like any other key, and the checkpoint loads the same."""
    value = {"a": {"": np.arange(3.0)}, "w": np.ones(2, np.int32)}
    path = jio.export(value, tmp_path / "ck", format="orbax")
    storage = json.loads((path / "jaxstruct_storage" / "metadata").read_text())
    assert storage["names"] == {"a0": "a.%", "a1": "w"}
    back = jio.load(path)
    np.testing.assert_array_equal(back["a"][""], value["a"][""])
    np.testing.assert_array_equal(back["w"], value["w"])
