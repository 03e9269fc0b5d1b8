"""Every byte of a ``format="orbax"`` checkpoint is checked on every read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jaxstruct.io as jio
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io._inspect import verify_report
from jaxstruct.orbax import _format, _orbax_internals, _read
from jaxstruct.orbax._units import json_crc
from jaxstruct.registry import SerializationError

from ._reseal import manifest_version_1, reseal
from .test_multiprocess import _all_ok, _finish, _start


def _value() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((64, 32)).astype(np.float32),
        "b": np.arange(7, dtype=np.int16),
        "tag": "model",
    }


def _targets() -> list[Any]:
    """Host arrays (orbax's restore), and shards that match or cut the stored chunks."""
    mesh = jax.make_mesh((4, 2), ("a", "b"))
    out: list[Any] = [None]
    for spec in (P("a", "b"), P(None, "a")):
        out.append(
            {
                "w": jax.ShapeDtypeStruct((64, 32), np.float32, sharding=NamedSharding(mesh, spec)),
                "b": jax.ShapeDtypeStruct((7,), np.int16, sharding=NamedSharding(mesh, P())),
                "tag": "model",
            }
        )
    return out


def _same(got: dict[str, Any]) -> bool:
    want = _value()
    return (
        got["tag"] == want["tag"]
        and np.array_equal(np.asarray(got["w"]), want["w"])
        and np.array_equal(np.asarray(got["b"]), want["b"])
    )


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _zarr_json(root: Path) -> list[dict[str, Any]]:
    """The zarr v3 metadata of every array stored in the OCDBT database at ``root``."""
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{root}/"}).result()
    keys = [k.decode() for k in kv.list().result() if k.endswith(b"zarr.json")]
    return [json.loads(kv.read(k).result().value) for k in keys]


def _record(path: Path, process: int = 0) -> dict[str, Any]:
    return json.loads((path / f"jaxstruct_checksums_{process}" / "metadata").read_text())


def _units_of(path: Path, name: str, process: int = 0) -> list[dict[str, Any]]:
    """The record's pieces of the array stored as ``name`` (records use the manifest's keys)."""
    names = json.loads((path / "jaxstruct_storage" / "metadata").read_text())["names"]
    return _record(path, process)["arrays"][next(k for k, v in names.items() if v == name)]


BIG = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)


def _sharded() -> dict[str, Any]:
    """``w`` sharded over a (4, 2) mesh: shards of (64, 128) float32, 32 KiB each, so that
    the middle of the largest data file lies in its data."""
    sharding = NamedSharding(jax.make_mesh((4, 2), ("a", "b")), P("a", "b"))
    return {**_value(), "w": jax.device_put(BIG, sharding)}


def test_every_stored_unit_has_its_crc32_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each replica-0 shard is cut into units of at most the chunk size, contiguous in the
    shard, whose CRC-32s the process records; each stored chunk is one unit, with no codec
    but its bytes (and zstd when compressed)."""
    monkeypatch.setattr(_format, "CHUNK_BYTES", 4096)  # (8, 128) float32 units of the shards
    path = jio.export(_sharded(), tmp_path / "ck", format="orbax")
    record = _record(path)
    assert record["crc32"] == json_crc(record)
    w = _units_of(path, "w")
    assert len(w) == 8 and {(p["axis"], p["step"], len(p["crcs"])) for p in w} == {(0, 8, 8)}
    found = {tuple(m["shape"]): m for m in _zarr_json(path / "arrays")}
    assert set(found) == {(256, 256), (7,)}
    for meta in found.values():
        assert [c["name"] for c in meta["codecs"]] == ["bytes"]
    # orbax's own choice would be (32, 32): a chunk cutting every row of the shard
    assert found[(256, 256)]["chunk_grid"]["configuration"]["chunk_shape"] == [8, 128]
    deflated = jio.export(_sharded(), tmp_path / "z", format="orbax", compression="deflate")
    for meta in _zarr_json(deflated / "arrays"):
        assert [c["name"] for c in meta["codecs"]] == ["bytes", "zstd"]
    for target in _big_targets():
        for saved in (path, deflated):
            got = jio.load(saved, target=target)
            assert np.array_equal(np.asarray(got["w"]), BIG)
            assert np.array_equal(got["b"], _value()["b"])


def _resharded() -> Any:
    sharding = NamedSharding(jax.make_mesh((4, 2), ("a", "b")), P(None, "a"))
    return jax.ShapeDtypeStruct((256, 256), np.float32, sharding=sharding)


def _big_targets() -> list[Any]:
    """Host arrays, the stored shards, and shards that cut the stored ones."""
    return [None, _sharded(), _targets()[2] | {"w": _resharded()}]


def _largest_data_file(path: Path) -> Path:
    return max(_files(path / "arrays"), key=lambda f: f.stat().st_size)


READS = {
    "numpy": lambda path: jio.load(path)["w"],
    "stored shards": lambda path: jio.load(path, target=_sharded())["w"],
    "resharded": lambda path: jio.load(path, target=_targets()[2] | {"w": _resharded()})["w"],
    "select": lambda path: jio.load(path, select=lambda v: v["w"]),
    "select into shards": lambda path: jio.load(path, target=_sharded(), select=lambda v: v["w"]),
}


@pytest.mark.parametrize("read", list(READS))
def test_a_flipped_byte_in_the_largest_data_file_fails_every_read(
    read: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One bit flipped in the middle of the largest data file: the whole restore, as NumPy,
    into the stored shards, resharded and with ``select=`` each raise our error naming the
    checkpoint, the array and its region; with the check switched off, the flip is loaded."""
    monkeypatch.setattr(_format, "CHUNK_BYTES", 4096)
    path = jio.export(_sharded(), tmp_path / "ck", format="orbax")
    data = _largest_data_file(path)
    blob = bytearray(data.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    data.write_bytes(blob)
    with pytest.raises(SerializationError, match="does not match its checksum") as info:
        READS[read](path)
    assert str(path) in str(info.value) and "array 'w', stored region [" in str(info.value)
    monkeypatch.setattr(_read, "_CHECK", False)
    assert not np.array_equal(np.asarray(READS[read](path)), BIG)


def test_the_users_own_orbax_saves_are_left_alone(tmp_path: Path) -> None:
    """Only the format's saves get the checksum codec: orbax's own zarr v3 saves keep theirs."""
    jio.export(_value(), tmp_path / "ours", format="orbax")  # the wrapper is installed
    handler = ocp.PyTreeCheckpointHandler(use_zarr3=True)
    checkpointer = ocp.Checkpointer(handler)
    checkpointer.save(tmp_path / "theirs", args=ocp.args.PyTreeSave({"w": _value()["w"]}))
    checkpointer.close()
    (meta,) = _zarr_json(tmp_path / "theirs")
    assert meta["codecs"][0]["name"] == "sharding_indexed"


# A restore orbax fails (a corrupt OCDBT manifest) leaves asyncio tasks of its own whose
# exceptions nobody retrieves; Python reports them as unraisable. Not ours, not the user's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_flipped_byte_in_any_stored_file_is_found_never_loaded(tmp_path: Path) -> None:
    """A flipped bit at 24 places of every file of the checkpoint (the middle of the largest
    data file included): each load (host, matching and cutting shards) either fails with
    our error naming the checkpoint, or gives the exact value."""
    path = jio.export(_value(), tmp_path / "ck", format="orbax")
    pristine = {f: f.read_bytes() for f in _files(path)}
    largest = max(pristine, key=lambda f: len(pristine[f]))
    silent, failed = [], 0
    for file, blob in pristine.items():
        places = sorted({len(blob) * i // 24 for i in range(24)} | {len(blob) // 2})
        if file == largest:
            places.append(len(blob) // 2 + 1)
        for at in places:
            flipped = bytearray(blob)
            flipped[at] ^= 0x04
            file.write_bytes(flipped)
            for n, target in enumerate(_targets()):
                try:
                    ok = _same(jio.load(path, target=target))
                except SerializationError as err:
                    assert str(path) in str(err), err
                    failed += 1
                    continue
                if not ok:
                    silent.append((str(file.relative_to(path)), at, n))
            file.write_bytes(blob)
    assert silent == []
    assert failed > 0


def test_a_corrupt_or_missing_checksum_record_is_our_error(tmp_path: Path) -> None:
    """A record changed (still valid JSON), truncated or missing, or one that leaves part of
    an array without a unit: every load raises our error naming the checkpoint."""
    path = jio.export(_sharded(), tmp_path / "ck", format="orbax")
    file = path / "jaxstruct_checksums_0" / "metadata"
    pristine = file.read_text()
    record = json.loads(pristine)
    (key,) = [k for k, v in record["arrays"].items() if v == _units_of(path, "w")]
    record["arrays"][key][0]["crcs"][0] ^= 1
    changed = json.dumps(record)
    del record["arrays"][key][3]
    record["crc32"] = json_crc(record)  # a consistent record that covers too little
    cases = {
        changed: "does not match its own checksum",
        pristine[: len(pristine) // 2]: "checksum record",
        json.dumps(record): "do not cover array 'w'",
        None: r"'jaxstruct_checksums_0' \(process 0 of 1\) is missing",
    }
    for text, message in cases.items():
        if text is None:
            file.unlink()
        else:
            file.write_text(text)
        for target in _big_targets():
            with pytest.raises(SerializationError, match=message) as info:
                jio.load(path, target=target)
            assert str(path) in str(info.value)
    file.write_text(pristine)
    assert np.array_equal(jio.load(path)["w"], BIG)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_checkpoints_with_crc32c_chunks_still_load_and_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint of jaxstruct-orbax 0.1 (a crc32c codec in every chunk, no unit records)
    loads every way, and tensorstore's check still finds a flipped byte."""
    monkeypatch.setattr(_orbax_internals, "_CHUNK_CRC", True)
    path = jio.export(_sharded(), tmp_path / "ck", format="orbax")
    for meta in _zarr_json(path / "arrays"):
        assert [c["name"] for c in meta["codecs"]] == ["bytes", "crc32c"]
    storage = path / "jaxstruct_storage" / "metadata"
    document = json.loads(storage.read_text())
    del document["checksums"]
    document["chunks"] = "crc32c"
    storage.write_text(json.dumps(document))
    reseal(path)
    shutil.rmtree(path / "jaxstruct_checksums_0")
    for target in _big_targets():
        assert np.array_equal(np.asarray(jio.load(path, target=target)["w"]), BIG)
    assert verify_report(path) == ([], True)
    data = _largest_data_file(path)
    blob = bytearray(data.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    data.write_bytes(blob)
    for target in _big_targets():
        with pytest.raises(SerializationError, match="does not match its checksum"):
            jio.load(path, target=target)


def test_a_checkpoint_without_checksums_still_restores(tmp_path: Path) -> None:
    """orbax's own checkpoints and the format's older ones (no checksums at all) load."""
    handler = ocp.PyTreeCheckpointHandler()
    checkpointer = ocp.Checkpointer(handler)
    checkpointer.save(tmp_path / "plain", args=ocp.args.PyTreeSave({"w": _value()["w"]}))
    checkpointer.close()
    got = jio.load(tmp_path / "plain", target={"w": np.zeros((64, 32), np.float32)})
    assert np.array_equal(got["w"], _value()["w"])
    path = jio.export(_value(), tmp_path / "ck", format="orbax")
    storage = path / "jaxstruct_storage" / "metadata"
    document = json.loads(storage.read_text())
    for key in ("crc32", "manifest_crc32", "checksums"):
        del document[key]
    storage.write_text(json.dumps(document))
    manifest_version_1(path)
    for target in _targets():
        assert _same(jio.load(path, target=target))
    assert verify_report(path) == ([], False)


def test_verify_reads_and_checks_every_array(tmp_path: Path) -> None:
    """``jaxstruct inspect --verify`` checks every chunk of a checksummed checkpoint."""
    path = jio.export(_value(), tmp_path / "ck", format="orbax")
    assert verify_report(path) == ([], True)
    files = _files(path / "arrays")
    largest = max(files, key=lambda f: f.stat().st_size)
    blob = bytearray(largest.read_bytes())
    blob[len(blob) // 2] ^= 1
    largest.write_bytes(blob)
    problems, checked = verify_report(path)
    assert checked and len(problems) == 1 and "does not match its checksum" in problems[0]


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import jaxstruct.io as jio
    from jaxstruct.io import _publish

    path, step = sys.argv[1], sys.argv[2]
    jio.export({"w": np.full(1 << 14, 1.0), "tag": "old"}, path, format="orbax")
    jio.load(path)
    pid = os.fork()
    if pid == 0:
        def hook(name):
            if name == step:
                os.kill(os.getpid(), signal.SIGKILL)
        _publish.STEP_HOOK = hook
        jio.export({"w": np.full(1 << 14, 2.0), "tag": "new"}, path, format="orbax",
                   overwrite=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    got = jio.load(path)
    assert got["tag"] in ("old", "new")
    assert np.all(got["w"] == (1.0 if got["tag"] == "old" else 2.0))
    jio.export({"w": np.full(1 << 14, 3.0), "tag": "next"}, path, format="orbax", overwrite=True)
    assert jio.load(path)["tag"] == "next"
    print(os.WIFSIGNALED(status))
    """
)


@pytest.mark.parametrize("step", ["encoded", "temp-synced", "published"])
def test_a_forked_writer_killed_at_each_step_keeps_a_loadable_checkpoint(
    step: str, tmp_path: Path
) -> None:
    """kill -9 of a forked child at each step of an overwrite: the old or the new
    checkpoint loads, every chunk checked, and the next export replaces it."""
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, str(tmp_path / "ck"), step],
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "True", f"the child was not killed at {step!r}"


@pytest.mark.xdist_group("multiprocess")
def test_two_processes_record_and_check_every_unit(tmp_path: Path) -> None:
    """After a 2-process save each process's record holds the units it wrote, together
    covering every array, and a load checks process 1's units too."""
    _all_ok(_finish(_start("save_restore", tmp_path)))
    saved = tmp_path / "ck"
    assert all(_units_of(saved, "a", i) for i in range(2))  # "a" is sharded over both
    mesh = jax.make_mesh((8,), ("x",))
    target = {
        "a": jax.ShapeDtypeStruct((16, 8), np.float32, sharding=NamedSharding(mesh, P(None, "x"))),
        "r": None,
        "step": None,
    }
    assert np.array_equal(
        np.asarray(jio.load(saved, target=target)["a"]), np.arange(128.0).reshape(16, 8)
    )
    # Process 1's record, changed and sealed again: its units are what a load checks.
    file = saved / "jaxstruct_checksums_1" / "metadata"
    record = json.loads(file.read_text())
    (key,) = record["arrays"]
    record["arrays"][key][0]["crcs"][0] ^= 1
    record["crc32"] = json_crc(record)
    file.write_text(json.dumps(record))
    with pytest.raises(SerializationError, match=r"'a', stored region \[8:10, 0:8\], does not"):
        jio.load(saved, target=target)
