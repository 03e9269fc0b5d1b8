"""jaxstruct-safetensors: registration, tensor names, exact dtypes, files the library reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.registry import SerializationError
from jaxstruct.safetensors import SafetensorsFormat
from safetensors import safe_open
from safetensors.numpy import load_file

from ._older import older


class Dense(js.Struct):
    w: Any
    b: Any
    act: str = js.field(static=True, default="relu")


class Model(js.Struct):
    layers: list
    scale: float = js.field(static=True, default=1.0)


def _raw(x: Any) -> np.ndarray:
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.ascontiguousarray(np.asarray(x)).reshape(-1).view(np.uint8)


def _same(a: Any, b: Any) -> None:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert type(x) is type(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert _raw(x).tobytes() == _raw(y).tobytes()


def test_registered_through_the_entry_point_group() -> None:
    """The format comes from the jaxstruct-safetensors distribution's entry point."""
    registry = jio.PluginRegistry()
    assert isinstance(registry.formats["safetensors"], SafetensorsFormat)
    assert registry.source_of("format", "safetensors") == "jaxstruct-safetensors"


def test_suffix_and_format_name_choose_it(tmp_path: Path) -> None:
    """``model.safetensors`` and ``format="safetensors"`` both write a safetensors file."""
    a = jio.export({"w": np.ones(2)}, tmp_path / "model.safetensors")
    b = jio.export({"w": np.ones(2)}, tmp_path / "other.bin", format="safetensors")
    for path in (a, b):
        assert path.is_file()
        assert list(load_file(str(path))) == ["w"]


def test_tensors_are_named_by_tree_path_with_the_manifest_in_the_metadata(tmp_path: Path) -> None:
    """Each array is the tensor named by its tree path; dots and slashes in keys are escaped."""
    state = {
        "params": Model(layers=[Dense(w=np.ones((2, 3), np.float32), b=np.zeros(3, np.float32))]),
        "v1.2/x": np.arange(4, dtype=np.int64),
        "100%": np.ones(1, np.uint8),
    }
    path = jio.export(state, tmp_path / "m.safetensors")
    with safe_open(str(path), framework="numpy") as f:
        names = set(f.keys())
        metadata = f.metadata()
    assert names == {"params.layers.0.w", "params.layers.0.b", "v1%2E2%2Fx", "100%25"}
    assert json.loads(metadata["jaxstruct.manifest"])["format"] == "jaxstruct"
    assert load_file(str(path))["params.layers.0.w"].tolist() == [[1.0] * 3] * 2
    back = jio.load(path, allow_imports=[__name__])
    assert back["params"].layers[0].act == "relu"
    _same(state, back)


def test_exact_dtypes_round_trip(tmp_path: Path) -> None:
    """bfloat16, float8 kinds, bool, complex, int4, big-endian and typed keys come back exact."""
    f8 = [jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float8_e4m3fnuz, jnp.float8_e5m2fnuz]
    state = {
        "bf16": jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3),
        "f8": [jnp.arange(4, dtype=d) for d in f8],
        "bool": jnp.array([True, False, True]),
        "c64": jnp.array([1 + 2j, -3j], jnp.complex64),
        "c128": np.array([[1 + 2j], [3 - 1j]], np.complex128),
        "int4": np.arange(-3, 3, dtype=ml_dtypes.int4),
        "big": np.arange(3, dtype=">f4"),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "key": jax.random.key(7),
        "empty": np.zeros((0, 4), np.float16),
        "scalar": np.float64(2.5) * np.ones(()),
    }
    path = jio.export(state, tmp_path / "d.safetensors")
    back = jio.load(path)
    _same(state, back)
    assert back["fortran"].flags.f_contiguous
    assert back["big"].dtype == np.dtype(">f4")
    # What other readers see: native dtypes as they are, complex as its real view.
    # (safetensors' NumPy side cannot return float8 tensors: those are checked by name.)
    with safe_open(str(path), framework="numpy") as f:
        names = [k for k in f.keys() if not k.startswith("f8")]  # noqa: SIM118
        plain = {k: f.get_tensor(k) for k in names}
    assert plain["bf16"].dtype == ml_dtypes.bfloat16
    assert plain["c64"].dtype == np.float32 and plain["c64"].shape == (2, 2)
    assert plain["c64"].tolist() == [[1.0, 2.0], [0.0, -3.0]]
    assert plain["int4"].dtype == np.uint8 and plain["int4"].shape == (6, 1)
    with safe_open(str(path), framework="numpy") as f:
        assert f.get_slice("f8.0").get_dtype() == "F8_E4M3"
        assert f.get_slice("f8.1").get_dtype() == "F8_E5M2"
        assert f.get_slice("f8.2").get_dtype() == "U8"


def test_sharded_arrays_round_trip_into_a_target_sharding(tmp_path: Path) -> None:
    """Arrays sharded over devices are written shard by shard and read into the target's shards."""
    mesh = jax.make_mesh((4, 2), ("a", "b"))
    w = jax.device_put(
        jnp.arange(64, dtype=jnp.float32).reshape(8, 8), NamedSharding(mesh, P("a", "b"))
    )
    rows = jax.device_put(
        jnp.arange(64, dtype=jnp.int32).reshape(16, 4), NamedSharding(mesh, P("a"))
    )
    state = Model(layers=[Dense(w=w, b=rows)])
    path = jio.export(state, tmp_path / "s.safetensors")
    target_sharding = NamedSharding(mesh, P("b", "a"))
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=target_sharding), state
    )
    back = jio.load(path, target=target)
    assert back.layers[0].w.sharding == target_sharding
    _same(state, back)


def _spy_library_writer(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record each call of ``safetensors.serialize_file`` (tensor name -> data address)."""
    import safetensors

    calls: list[dict[str, Any]] = []
    real = safetensors.serialize_file

    def spy(specs: dict, filename: Any, metadata: Any = None) -> None:
        calls.append({name: spec.data_ptr for name, spec in specs.items()})
        calls[-1][""] = Path(filename)
        real(specs, filename, metadata=metadata)

    monkeypatch.setattr(safetensors, "serialize_file", spy)
    return calls


def test_the_safetensors_library_writes_host_arrays_from_their_own_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NumPy arrays and CPU jax.Arrays go to ``safetensors.serialize_file`` uncopied."""
    calls = _spy_library_writer(monkeypatch)
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    j = jnp.arange(5, dtype=jnp.bfloat16)
    path = jio.export(
        {"w": w, "j": j, "f8": jnp.ones(3, jnp.float8_e4m3fn)}, tmp_path / "l.safetensors"
    )
    assert len(calls) == 1
    assert calls[0]["w"] == w.ctypes.data
    assert calls[0]["j"] == j.unsafe_buffer_pointer()
    # The library was given a path in a directory of its own, named after jaxstruct's
    # temporary; its file was moved onto that temporary, which was published,
    assert calls[0][""].parent.name.startswith(".l.safetensors.jaxstruct-tmp-")
    # with the mode of any new file (the library creates its temporary with 0o600).
    assert [p.name for p in tmp_path.iterdir()] == ["l.safetensors"]
    (tmp_path / "plain").touch()
    assert path.stat().st_mode == (tmp_path / "plain").stat().st_mode
    back = jio.load(path)
    assert back["w"].tolist() == w.tolist() and back["j"].dtype == jnp.bfloat16
    assert back["f8"].dtype == jnp.float8_e4m3fn
    with safe_open(str(path), framework="numpy") as f:
        assert f.get_tensor("w").tolist() == w.tolist()


@pytest.mark.parametrize("budget", [0, 64 << 20])
def test_arrays_needing_host_copies_over_the_budget_are_written_tensor_by_tensor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    """Past ``COPY_BUDGET`` bytes of host copies the file is written here, an array split
    along its first axis shard by shard (never gathered); within it, by the library."""
    from jaxstruct.safetensors import _write

    monkeypatch.setattr(_write, "COPY_BUDGET", budget)
    calls = _spy_library_writer(monkeypatch)
    gathered: list[tuple[int, ...]] = []
    real_host_array = _write.host_array

    def spy_host_array(arr: Any) -> np.ndarray:
        gathered.append(tuple(arr.shape))
        return real_host_array(arr)

    monkeypatch.setattr(_write, "host_array", spy_host_array)
    mesh = jax.make_mesh((8,), ("a",))
    rows = jax.device_put(
        jnp.arange(64, dtype=jnp.int32).reshape(16, 4), NamedSharding(mesh, P("a"))
    )
    state = {"rows": rows, "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3))}
    path = jio.export(state, tmp_path / "b.safetensors")
    assert len(calls) == (1 if budget else 0)
    if not budget:
        assert (16, 4) not in gathered
    assert load_file(str(path))["rows"].tolist() == np.asarray(rows).tolist()
    _same(state, jio.load(path))


def test_a_header_too_large_for_safetensors_names_the_other_formats(tmp_path: Path) -> None:
    """The library writes (and opens) headers up to 100 MB: past that, our error and the fix."""
    state = {"w": np.ones(2), "note": "x" * 100_000_000}
    with pytest.raises(SerializationError, match=r"over the 100,000,000 bytes .* format=.orbax"):
        jio.export(state, tmp_path / "big.safetensors")
    assert list(tmp_path.iterdir()) == []


KILLED_DURING_THE_WRITE = """
import os, signal, sys
import numpy as np
import safetensors
import jaxstruct.io as jio

def killed(specs, filename, metadata=None):
    # What the library has made when the process dies: its temporary, half written.
    with open(os.path.join(os.path.dirname(filename), ".tmpAbC123"), "wb") as f:
        f.write(b"x" * 4096)
    os.kill(os.getpid(), signal.SIGKILL)

safetensors.serialize_file = killed
jio.export({"w": np.ones(4)}, sys.argv[1])
"""


def test_an_export_killed_in_the_library_writer_leaves_nothing_the_next_keeps(
    tmp_path: Path,
) -> None:
    """The library's temporary is in a directory named after jaxstruct's temporary, so
    the next export to that path removes what a killed one left (a dead writer's)."""
    import subprocess
    import sys

    path = tmp_path / "k.safetensors"
    run = subprocess.run([sys.executable, "-c", KILLED_DURING_THE_WRITE, str(path)], check=False)
    assert run.returncode == -9
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left and all(name.startswith(".k.safetensors.jaxstruct-tmp-") for name in left)
    assert any((tmp_path / name / ".tmpAbC123").is_file() for name in left)
    jio.export({"w": np.zeros(2)}, path)
    assert [p.name for p in tmp_path.iterdir()] == ["k.safetensors"]


def test_select_reads_only_the_selected_tensor(tmp_path: Path, monkeypatch) -> None:
    """``select=`` reads the bytes of the tensors it picks, and no other tensor's."""
    from jaxstruct.safetensors import _read

    state = {f"t{i}": np.full((256,), i, np.float32) for i in range(64)}
    path = jio.export(state, tmp_path / "many.safetensors")
    read = []
    real = _read.os.preadv

    def counting(fd: int, buffers: list, offset: int) -> int:
        read.append(sum(len(b) for b in buffers))
        return real(fd, buffers, offset)

    monkeypatch.setattr(_read.os, "preadv", counting)
    out = jio.load(path, select=lambda s: s["t17"])
    assert out.tolist() == [17.0] * 256
    assert sum(read) == 256 * 4
    assert sum(read) < 0.02 * path.stat().st_size


def test_overwrite_replaces_only_jaxstruct_files(tmp_path: Path) -> None:
    """A safetensors file another tool wrote is never replaced by ``overwrite=True``."""
    from safetensors.numpy import save_file

    theirs = tmp_path / "theirs.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(theirs))
    with pytest.raises(SerializationError, match="not a jaxstruct"):
        jio.export({"w": np.zeros(2)}, theirs, overwrite=True)
    ours = jio.export({"w": np.ones(2)}, tmp_path / "ours.safetensors")
    jio.export({"w": np.zeros(2)}, ours, overwrite=True)
    assert jio.load(ours)["w"].tolist() == [0.0, 0.0]


def test_compression_deflate_is_refused(tmp_path: Path) -> None:
    """safetensors files are never compressed: asking for it is an error, nothing written."""
    with pytest.raises(SerializationError, match="never compressed"):
        jio.export({"w": np.ones(2)}, tmp_path / "c.safetensors", compression="deflate")
    assert not (tmp_path / "c.safetensors").exists()


def test_rename_with_a_jaxstruct_file_is_an_error(tmp_path: Path) -> None:
    """``rename=`` only applies to files without a manifest, and says so."""
    path = jio.export({"w": np.ones(2)}, tmp_path / "r.safetensors")
    with pytest.raises(SerializationError, match="rename= is only for files without"):
        jio.load(path, rename={"w": "v"})


def test_tree_paths_of_every_container(tmp_path: Path) -> None:
    """Tuples, namedtuples and other pytree nodes by position, dict keys by their text; two
    keys with the same text (``1`` and ``"1"``) still get distinct names."""
    import collections

    Pair = collections.namedtuple("Pair", "left right")
    state = {
        "t": (np.zeros(1), np.ones(1)),
        "n": Pair(np.zeros(2), np.ones(2)),
        1: np.zeros(3),
        "1": np.ones(3),
        None: np.zeros(4),
    }
    path = jio.export(state, tmp_path / "p.safetensors")
    with safe_open(str(path), framework="numpy") as f:
        names = set(f.keys())
    assert {"t.0", "t.1", "n.0", "n.1", "None"} < names
    assert "1" in names and len([n for n in names if n.startswith("1")]) == 2
    back = jio.load(path, allow_imports=[__name__])
    assert back[1].tolist() == [0.0] * 3 and back["1"].tolist() == [1.0] * 3
    assert type(back["n"]).__name__ == "Pair" and back["n"].right.tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: {**t, "a0": {"name": "missing"}}, "which the file does not hold"),
        (lambda t: {**t, "a0": {**t["a0"], "as": "zip"}}, "malformed"),
        (lambda t: {**t, "a0": {**t["a0"], "as": "complex"}}, "stored as complex needs F32"),
        (lambda t: {k: v for k, v in t.items() if k != "a0"}, "disagree"),
        (lambda t: [], "not an object"),
        # Text as it stands (not a value to encode): nested past Python's parser, a repeated key.
        (lambda t: "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        (lambda t: '{"a0": {}, "a0": {}}', "duplicate JSON key 'a0'"),
    ],
)
def test_a_tampered_tensor_table_is_our_error(tmp_path: Path, edit: Any, message: str) -> None:
    """The metadata's tensor table is checked against the header and the manifest."""
    from jaxstruct.safetensors import _header

    path = jio.export({"w": np.ones(2)}, tmp_path / "t.safetensors")
    with open(path, "rb") as f:
        header = _header.read_header(f, jio.Limits(), "x")
        data = path.read_bytes()[header.data_start :]
    metadata = dict(header.metadata)
    # As written before checksums (a header CRC would refuse any edit first)
    older(metadata)
    edited = edit(json.loads(metadata["jaxstruct.tensors"]))
    metadata["jaxstruct.tensors"] = edited if isinstance(edited, str) else json.dumps(edited)
    entries = {
        name: ({np.dtype("<f8"): "F64"}[e.dtype], e.shape, e.end - e.begin)
        for name, e in header.tensors.items()
    }
    path.write_bytes(_header.encode_header(metadata, entries) + data)
    with pytest.raises(SerializationError, match=message):
        jio.load(path)


@pytest.mark.parametrize("budget", [0, 64 << 20], ids=["tensor by tensor", "library"])
def test_a_big_file_is_flushed_while_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    """From ``FLUSH_FROM`` bytes on, the file being written (the library's temporary, or
    ours) is flushed to disk meanwhile, and the file is whole; below, nothing is."""
    import os
    import threading

    from jaxstruct.io import _publish
    from jaxstruct.safetensors import _write

    monkeypatch.setattr(_write, "COPY_BUDGET", budget)
    monkeypatch.setattr(_publish, "FLUSH_EVERY_S", 0.0)
    flushed: list[int] = []  # inodes flushed from another thread than the writer's
    writer = threading.get_ident()
    real = os.fdatasync

    def spy(fd: int) -> None:
        assert threading.get_ident() != writer
        flushed.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(_write.os, "fdatasync", spy)
    state = {f"w{i}": np.full((256, 256), i, np.float32) for i in range(16)}  # 4 MiB
    jio.export(state, tmp_path / "small.safetensors")
    assert flushed == []
    monkeypatch.setattr(_write, "FLUSH_FROM", 1 << 20)
    path = jio.export(state, tmp_path / "big.safetensors")
    assert flushed and set(flushed) == {path.stat().st_ino}
    _same(state, jio.load(path))


def test_a_failing_flush_leaves_the_export_to_its_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush that fails (a file system without it) stops the flushing, nothing else."""
    from jaxstruct.safetensors import _write

    def refuse(fd: int) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(_write, "FLUSH_FROM", 0)
    monkeypatch.setattr(_write.os, "fdatasync", refuse)
    state = {"w": np.arange(1000.0)}
    _same(state, jio.load(jio.export(state, tmp_path / "x.safetensors")))
