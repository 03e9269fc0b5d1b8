"""The per-array fast paths of the built-in formats: batched placement, buffered zip writing,
the reused JSON node encoder, inline removal of a small old checkpoint, and the fsync round."""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import threading
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io import _zip
from jaxstruct.io._encode import dump_manifest, encode_state
from jaxstruct.io._inspect import verify_report
from jaxstruct.registry import SerializationError

SUFFIX = {"directory": "", "zip": ".zip"}


def _mixed() -> dict[str, Any]:
    return {
        "f32": jnp.arange(6, dtype=jnp.float32).reshape(2, 3),
        "bf16": jnp.arange(4, dtype=jnp.bfloat16),
        "f16": jnp.ones(3, jnp.float16),
        "i8": jnp.arange(-2, 2, dtype=jnp.int8),
        "u32": jnp.arange(5, dtype=jnp.uint32),
        "bool": jnp.array([True, False, True]),
        "c64": jnp.array([1 + 2j, 3j], jnp.complex64),
        "scalar": jnp.float32(2.5) * jnp.ones((), jnp.float32),
        "weak": jnp.asarray(0.5),
        "empty": jnp.zeros((0, 3), jnp.float32),
        "key": jax.random.key(3),
        "rbg_keys": jax.random.split(jax.random.key(4, impl="rbg"), 3),
        "host": np.arange(3, dtype=np.int16),
    }


@pytest.mark.parametrize("fmt", ["directory", "zip"])
def test_batched_placement_keeps_dtypes_weak_types_and_keys(
    fmt: str, tmp_path: Path, same: Callable[[Any, Any], None]
) -> None:
    """Every kind of JAX leaf comes back exactly, though all are placed in one device_put."""
    value = _mixed()
    back = jio.load(jio.export(value, tmp_path / f"ck{SUFFIX[fmt]}"))
    keys = ("key", "rbg_keys")
    same(
        {k: v for k, v in value.items() if k not in keys},
        {k: back[k] for k in value if k not in keys},
    )
    for k in keys:
        assert back[k].dtype == value[k].dtype
        assert jax.random.key_impl(back[k]) == jax.random.key_impl(value[k])
        np.testing.assert_array_equal(jax.random.key_data(back[k]), jax.random.key_data(value[k]))
    assert back["bf16"].dtype == ml_dtypes.bfloat16
    assert back["weak"].weak_type and not back["f32"].weak_type
    assert isinstance(back["host"], np.ndarray)
    for k in value:
        if k != "host":
            assert back[k].sharding == SingleDeviceSharding(jax.devices()[0])


def test_load_places_small_arrays_without_jax_device_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten small JAX arrays are placed through XLA's batched put, not ten (or one batched)
    jax.device_put calls, with what jax.device_put would give: placement, uncommitted,
    strong types, and the aligned buffer read from disk adopted without a copy."""
    path = jio.export({f"a{i}": jnp.arange(8.0) + i for i in range(10)}, tmp_path / "ck")
    calls: list[Any] = []
    real = jax.device_put

    def spy(x: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(x)
        return real(x, *args, **kwargs)

    monkeypatch.setattr(jax, "device_put", spy)
    back = jio.load(path)
    assert calls == []
    reference = real(np.arange(8.0, dtype=np.float32))
    for i in range(10):
        arr = back[f"a{i}"]
        assert arr.tolist() == [float(i + j) for j in range(8)]
        assert arr.unsafe_buffer_pointer() % 64 == 0
        assert (arr.aval, arr.sharding, arr.committed) == (
            reference.aval,
            reference.sharding,
            reference.committed,
        )
        assert not arr.weak_type


@pytest.mark.parametrize("fmt", ["directory", "zip"])
def test_small_arrays_are_adopted_without_a_copy_from_one_bounded_buffer(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The small arrays a load reads from memory are handed to JAX aligned, so XLA adopts
    each buffer instead of copying it; they share one buffer no bigger than the archive
    plus 64 bytes per member, so a kept array holds no more than that alive."""
    from jaxstruct.io import _decode, _jax_private

    value: dict[str, Any] = {f"a{i}": jnp.arange(3 + i, dtype=jnp.float32) for i in range(10)}
    value["h"] = np.arange(5, dtype=np.int16)  # a host leaf comes back as numpy
    path = jio.export(value, tmp_path / f"ck{SUFFIX[fmt]}")
    given: list[np.ndarray] = []
    real = _jax_private.put_on_default_device

    def spy(arrays: list[Any]) -> Any:
        given.extend(arrays)
        return real(arrays)

    monkeypatch.setattr(_decode, "put_on_default_device", spy)
    back = jio.load(path)
    assert len(given) == 10
    placed = sorted((back[f"a{i}"] for i in range(10)), key=lambda a: a.size)
    for host, arr in zip(sorted(given, key=lambda a: a.size), placed, strict=True):
        assert arr.unsafe_buffer_pointer() == host.ctypes.data  # adopted, not copied
    archive = path / "arrays.npz" if fmt == "directory" else path
    host = back["h"]
    assert host.tolist() == list(range(5)) and host.ctypes.data % 64 == 0
    root: Any = host
    while getattr(root, "base", None) is not None:
        root = root.base
    assert memoryview(root).nbytes <= archive.stat().st_size + 64 * 12


def test_batched_placement_follows_the_default_device(tmp_path: Path) -> None:
    """Under ``jax.default_device``, every small array lands where jax.device_put puts it,
    uncommitted, as a plain load of one array does."""
    path = jio.export({f"a{i}": jnp.arange(4.0) + i for i in range(5)}, tmp_path / "ck")
    device = jax.devices()[3]
    with jax.default_device(device):
        back = jio.load(path)
        reference = jax.device_put(np.ones(4, np.float32))
    for i in range(5):
        assert back[f"a{i}"].devices() == {device} == reference.devices()
        assert back[f"a{i}"].committed is reference.committed
        np.testing.assert_array_equal(back[f"a{i}"], np.arange(4.0) + i)


def test_placement_falls_back_to_jax_device_put_when_the_seam_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without XLA's batched put (a JAX that moved it), the arrays go through jax.device_put."""
    from jaxstruct.io import _decode

    monkeypatch.setattr(_decode, "put_on_default_device", lambda arrays: None)
    path = jio.export({f"a{i}": jnp.arange(3.0) + i for i in range(4)}, tmp_path / "ck")
    back = jio.load(path)
    for i in range(4):
        assert isinstance(back[f"a{i}"], jax.Array)
        assert back[f"a{i}"].tolist() == [float(i + j) for j in range(3)]


def test_batched_placement_with_a_target_keeps_the_target_shardings(
    tmp_path: Path, same: Callable[[Any, Any], None]
) -> None:
    """Leaves with a target sharding get it; the None leaves beside them are batched as stored."""
    value = {"w": jnp.arange(16.0).reshape(8, 2), "b": jnp.arange(3), "c": jnp.ones(2, jnp.int8)}
    path = jio.export(value, tmp_path / "ck")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    rows = NamedSharding(mesh, P("x"))
    back = jio.load(
        path,
        target={
            "w": jax.ShapeDtypeStruct((8, 2), jnp.float32, sharding=rows),
            "b": None,
            "c": None,
        },
    )
    assert back["w"].sharding == rows
    assert back["b"].sharding == back["c"].sharding == SingleDeviceSharding(jax.devices()[0])
    same(value, back)


def test_batched_placement_leaves_64_bit_arrays_to_their_clear_error() -> None:
    """With x64 off, a stored 64-bit JAX array among others still fails with our message."""
    value = {
        "a": np.arange(3, dtype=np.int64),
        "b": np.ones(2, np.float32),
        "c": np.ones(1, np.float32),
    }
    payload = jio.to_state_dict(value)
    for node in payload["manifest"]["nodes"]:
        if node[0] == "array":
            node[0] = "jaxarray"
    assert not jax.config.read("jax_enable_x64")
    with pytest.raises(SerializationError, match="jax_enable_x64"):
        jio.from_state_dict(payload)


@pytest.mark.parametrize("compression", ["auto", "none", "deflate"])
def test_buffered_zip_writer_mixes_tiny_and_large_members(compression: str, tmp_path: Path) -> None:
    """Tiny members go through the buffer, large ones straight and via the pool; all read back."""
    rng = np.random.default_rng(0)
    sizes = [5] * 40 + [300_000] + [0, 7] + [100_000] * 3 + [3] * 5 + [2 << 20]
    contents = [rng.integers(0, 4, n, dtype=np.uint8).tobytes() for n in sizes]
    members = [
        _zip.Member.of(f"m{i}", [c[: len(c) // 2], c[len(c) // 2 :]])
        for i, c in enumerate(contents)
    ]
    path = tmp_path / "a.zip"
    with open(path, "wb", buffering=0) as handle:
        handle.write(b"prefix")  # offsets count from where the stream is
        size, crc = _zip.write_zip(handle, members, compression=compression)
    data = path.read_bytes()
    assert len(data) == 6 + size and zlib.crc32(data[6:]) == crc
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
        assert [archive.read(f"m{i}") for i in range(len(sizes))] == contents


@pytest.mark.parametrize("compression", ["auto", "none"])
def test_all_tiny_members_write_the_bytes_of_the_general_path(
    compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-write path for archives of tiny members gives byte for byte the general output."""
    rng = np.random.default_rng(1)
    for _ in range(30):
        members = [
            _zip.Member.of(f"m{i}é.npy", [rng.bytes(int(rng.integers(0, 60))), b"x" * i])
            for i in range(int(rng.integers(1, 12)))
        ]
        assert _zip._all_tiny(members)
        quick, general = io.BytesIO(), io.BytesIO()
        seen: list[str] = []
        got = _zip.write_zip(quick, members, compression=compression, after_member=seen.append)
        with monkeypatch.context() as patch:
            patch.setattr(_zip, "_all_tiny", lambda members: False)
            want = _zip.write_zip(general, members, compression=compression)
        assert got == want and quick.getvalue() == general.getvalue()
        assert seen == [m.name for m in members]
        with zipfile.ZipFile(quick) as archive:
            assert archive.testzip() is None


def test_node_encoder_matches_json_dumps() -> None:
    """manifest.json holds each node exactly as json.dumps would, one per line."""
    value = {"s": 'é"\\\n', "big": 2**80, "f": 0.1, "t": (True, None), "arrays": [np.ones(2)]}
    state = encode_state(value)
    text = dump_manifest(state, "directory").decode("ascii")
    lines = text.split("\n")
    start = lines.index(f'"manifest":{{"root":{state["manifest"]["root"]},"nodes":[')
    nodes = state["manifest"]["nodes"]
    compact = [json.dumps(n, ensure_ascii=True, separators=(",", ":")) for n in nodes]
    assert lines[start + 1 : start + len(nodes)] == [c + "," for c in compact[:-1]]
    assert lines[start + len(nodes)].startswith(compact[-1] + ']},"seal":"crc32:')
    assert json.loads(text)["manifest"]["nodes"] == json.loads(json.dumps(nodes))


@pytest.mark.parametrize("nbytes", [24, 3 << 20], ids=["small", "large"])
def test_old_checkpoint_is_gone_when_overwrite_returns(nbytes: int, tmp_path: Path) -> None:
    """Overwriting a directory checkpoint, small or large, deletes the old one before export
    returns (the deletion is never left to a thread that os._exit would cut short)."""
    path = jio.export({"v": "old", "a": np.ones(nbytes // 8)}, tmp_path / "ck", compression="none")
    jio.export({"v": "new", "a": np.zeros(3)}, path, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]
    assert jio.load(path)["v"] == "new"


@pytest.mark.parametrize("nbytes", [8, 3 << 20], ids=["small", "large"])
def test_failed_directory_fsync_fails_the_export(
    nbytes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fsync error on the new checkpoint's directory is raised (the pool syncs it while
    the calling thread syncs a file), small checkpoint or large; the old checkpoint stays."""
    path = jio.export({"v": "old"}, tmp_path / "ck")
    real = os.fsync
    threads: list[str] = []

    def failing(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            threads.append(threading.current_thread().name)
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", failing)
    new = {"v": "new", "a": np.zeros(nbytes, np.uint8)}
    with pytest.raises(jio.CheckpointWriteError, match="Input/output error"):
        jio.export(new, path, overwrite=True, compression="none")
    monkeypatch.setattr(os, "fsync", real)
    assert threads and threads[0] != "MainThread"
    assert jio.load(path) == {"v": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


@pytest.mark.parametrize("fmt", ["directory", "zip"])
def test_small_members_read_whole_and_large_ones_in_pieces_agree(fmt: str, tmp_path: Path) -> None:
    """Members on both sides of the read-whole size load the same, and corruption is caught."""
    limit = _zip._READ_WHOLE
    value = {
        "below": np.arange(limit // 8 - 32, dtype=np.float64),  # header + data <= the limit
        "above": np.arange(limit // 8 + 32, dtype=np.float64),
        "tiny": np.array([1.5, -7.25]),
    }
    path = jio.export(value, tmp_path / f"ck{SUFFIX[fmt]}", compression="none")
    back = jio.load(path)
    for k, arr in value.items():
        np.testing.assert_array_equal(back[k], arr)
    archive = path / "arrays.npz" if fmt == "directory" else path
    data = bytearray(archive.read_bytes())
    pos = data.find(np.array([1.5, -7.25]).tobytes())
    assert pos > 0
    data[pos + 7] ^= 0xFF  # corrupt "tiny", read whole
    archive.write_bytes(bytes(data))
    with pytest.raises(SerializationError, match=r"'a2\.npy'.*CRC"):
        jio.load(path)
    assert any("CRC" in p for p in verify_report(path)[0])


def test_overlapping_gc_pauses_restore_the_collector_once() -> None:
    """Pauses that overlap across threads turn the collector back on only when the last ends."""
    import gc
    import threading

    from jaxstruct.io import _process

    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with _process.paused():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with _process.paused():
        thread.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread's pause is still on
    leave.set()
    thread.join(10)
    assert gc.isenabled()
    gc.disable()
    try:
        with _process.paused():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()


@pytest.mark.parametrize("fmt", ["directory", "zip"])
def test_loading_leaves_access_times_alone(fmt: str, tmp_path: Path) -> None:
    """A load does not write to the checkpoint: its files keep their access times (O_NOATIME),
    even on a relatime mount, where the first read after a write would update them."""
    path = jio.export({"a": np.arange(3.0)}, tmp_path / f"ck{SUFFIX[fmt]}")
    files = [path / "manifest.json", path / "arrays.npz"] if fmt == "directory" else [path]
    for file in files:
        info = file.stat()
        os.utime(file, ns=(info.st_mtime_ns - 10**12, info.st_mtime_ns))  # atime well before mtime
    before = [file.stat().st_atime_ns for file in files]
    jio.load(path)
    assert [file.stat().st_atime_ns for file in files] == before


def test_gc_is_paused_for_the_parse_only(tmp_path: Path) -> None:
    """Load pauses Python's collector only while it parses the manifest: user code it calls
    (select, migrations) runs with the collector as the user left it."""
    import gc

    from jaxstruct.io import _schema

    seen: list[bool] = []
    # A manifest of more than 64 KiB (a small one is parsed with the collector on: too few
    # objects for it to run often).
    path = jio.export({"a": np.arange(3.0), "b": list(range(10_000))}, tmp_path / "ck")

    def select(value: Any) -> Any:
        seen.append(gc.isenabled())
        return value["a"]

    real = _schema.json.loads

    def parse(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    assert gc.isenabled()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_schema.json, "loads", parse)
        jio.load(path, select=select)
    assert seen[0] is False  # the parse
    assert seen[1:] and all(seen[1:]), seen  # select, on the skeleton and on the value
    assert gc.isenabled()
