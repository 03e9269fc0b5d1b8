"""Arrays in accelerator memory are copied to the host in bounded pieces (issue 35, item 3).

CPU devices hold their arrays in host memory, where export views them in place;
``_host.FORCE_STREAMING`` sends them through the streaming path that arrays on
an accelerator take, so that path is tested here byte for byte.
"""

from __future__ import annotations

import io
import threading
import weakref
import zipfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io import _async, _budget, _host, _zip
from jaxstruct.registry import SerializationError

from .conftest import assert_same

KEY = jax.random.key(35)


@pytest.fixture
def streaming(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_host, "FORCE_STREAMING", True)


def _mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("a", "b"))


def _dtypes() -> dict[str, Any]:
    """One array per dtype models use, shaped so that small budgets cut them into pieces."""
    normal = jax.random.normal(KEY, (96, 130), jnp.float32)
    out: dict[str, Any] = {
        "bf16": normal.astype(jnp.bfloat16),
        "f16": normal.astype(jnp.float16),
        "f32": normal,
        "e4m3": normal.astype(jnp.float8_e4m3fn),
        "e5m2": normal.astype(jnp.float8_e5m2),
        "i8": jax.random.randint(KEY, (70, 33), -128, 127, jnp.int8),
        "u32": jax.random.randint(KEY, (5, 7, 300), 0, 1 << 30).astype(jnp.uint32),
        "bool": normal > 0.3,
        "c64": jax.lax.complex(normal, normal[::-1]),
        "scalar": jnp.float32(-2.5),
        "scalar_bf16": jnp.bfloat16(1.5),
        "empty": jnp.zeros((0, 17), jnp.float32),
        "one_long_row": jax.random.normal(KEY, (2, 50_000), jnp.float32),
    }
    if hasattr(jnp, "int4"):
        out["i4"] = jax.random.randint(KEY, (64, 31), -8, 8).astype(jnp.int4)
        out["u4"] = jax.random.randint(KEY, (3, 33), 0, 16).astype(jnp.uint4)
    return out


def _sharded() -> dict[str, Any]:
    """The same data placed every way an 8-device mesh shards it."""
    mesh = _mesh()
    data = jax.random.normal(KEY, (64, 96), jnp.float32).astype(jnp.bfloat16)
    return {
        f"spec_{name}": jax.device_put(data, NamedSharding(mesh, spec))
        for name, spec in (
            ("rows", P(("a", "b"))),  # runs of whole rows
            ("cols", P(None, ("a", "b"))),  # column blocks: not contiguous in the file
            ("grid", P("a", "b")),  # both
            ("replicated", P()),
            ("cols_then_rows", P("b", "a")),
        )
    }


def _files(path: Path) -> dict[str, bytes]:
    if path.is_dir():
        return {p.name: p.read_bytes() for p in sorted(path.iterdir())}
    return {path.name: path.read_bytes()}


@pytest.mark.parametrize("compression", ["none", "auto", "deflate"])
@pytest.mark.parametrize("name", ["ck", "ck.zip"])
def test_streamed_export_writes_the_same_bytes_as_the_in_place_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, compression: str
) -> None:
    """Every dtype, 0-d, empty and every sharding over 8 devices, streamed through a budget
    small enough to cut them into many pieces: the files equal those of the in-place path."""
    state = {**_dtypes(), **_sharded()}
    jio.export(state, tmp_path / "plain" / name, compression=compression)
    monkeypatch.setattr(_host, "FORCE_STREAMING", True)
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, "16K")
    jio.export(state, tmp_path / "streamed" / name, compression=compression)
    assert _files(tmp_path / "streamed" / name) == _files(tmp_path / "plain" / name)
    loaded = jio.load(tmp_path / "streamed" / name, target=state)
    assert_same(state, loaded)


def test_streamed_archive_is_a_valid_npz_with_correct_crcs(tmp_path: Path, streaming: None) -> None:
    """The CRCs patched in after streaming are right (zipfile checks each member) and
    numpy reads the arrays back."""
    state = {k: v for k, v in _dtypes().items() if not k.startswith(("i4", "u4", "e", "bf"))}
    state["big"] = jax.random.normal(KEY, (1024, 1024), jnp.float32)  # chunks written directly
    jio.export(state, tmp_path / "ck", compression="none")
    with zipfile.ZipFile(tmp_path / "ck" / "arrays.npz") as archive:
        assert archive.testzip() is None
    with np.load(tmp_path / "ck" / "arrays.npz") as npz:
        assert len(npz.files) == len(state)


class _Copies:
    """Counts the device copies the stream starts and the bytes of those still alive."""

    def __init__(self) -> None:
        self.calls = 0
        self.copied = 0
        self.alive = 0
        self.peak = 0
        self.lock = threading.Lock()

    def __call__(self, data: Any, local: Any) -> Any:
        out = _host._fresh(data, local)
        assert out is not data  # a host copy cached on `data` would outlive the export
        nbytes = out.size * out.dtype.itemsize
        with self.lock:
            self.calls += 1
            self.copied += nbytes
            self.alive += nbytes
            self.peak = max(self.peak, self.alive)
        weakref.finalize(out, self._gone, nbytes)
        return out

    def _gone(self, nbytes: int) -> None:
        with self.lock:
            self.alive -= nbytes


def test_host_memory_in_flight_never_exceeds_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streaming: None
) -> None:
    """Two exports at once, of arrays many times the budget (column shards joined on the
    host too): the host bytes held never pass the budget, counted by the stream and by
    watching the copies themselves."""
    budget = 256 << 10
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, str(budget))
    copies = _Copies()
    monkeypatch.setattr(_host, "copy_start", copies)
    held: list[int] = []
    monkeypatch.setattr(_budget, "WATCH", held.append)
    mesh = _mesh()
    data = jax.random.normal(KEY, (512, 1024), jnp.float32)  # 2 MiB each
    state = {
        "rows": data,
        "cols": jax.device_put(data, NamedSharding(mesh, P(None, ("a", "b")))),
        "grid": jax.device_put(data, NamedSharding(mesh, P("a", "b"))),
    }
    errors: list[BaseException] = []

    def export(name: str) -> None:
        try:
            jio.export(state, tmp_path / name, compression="none")
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=export, args=(n,)) for n in ("one", "two.zip")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert copies.calls > 2 * 3 * 8  # many pieces per array
    assert max(held) <= budget, max(held)
    assert copies.peak <= budget, copies.peak
    assert held[-1] == 0  # everything given back
    for name in ("one", "two.zip"):
        assert_same(state, jio.load(tmp_path / name, target=state))


def test_a_stored_export_copies_each_array_from_the_device_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streaming: None
) -> None:
    """Stored members are copied, checksummed and written in one pass (they were copied
    twice: once for the CRC, once to write), in both built-in formats."""
    mesh = _mesh()
    data = jax.random.normal(KEY, (256, 512), jnp.float32)
    state = {"a": data, "b": jax.device_put(data, NamedSharding(mesh, P("a", "b")))}
    for name in ("ck", "ck.zip"):
        copies = _Copies()
        monkeypatch.setattr(_host, "copy_start", copies)
        jio.export(state, tmp_path / name, compression="none")
        assert copies.copied == 2 * data.size * 4, name


class _Boom(RuntimeError):
    pass


class _FailsToLand:
    """A device copy whose transfer fails when waited for."""

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise _Boom("DMA failed")


@pytest.mark.parametrize("compression", ["none", "deflate"])
@pytest.mark.parametrize("where", ["start", "land"])
@pytest.mark.parametrize("name", ["ck", "ck.zip"])
@pytest.mark.usefixtures("streaming")
def test_a_device_copy_failing_midway_leaves_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, where: str, compression: str
) -> None:
    """A copy from the device that fails in the middle of an export (when started or when
    waited for) raises our error naming the array; the checkpoint there is untouched and
    nothing is left beside it."""
    path = tmp_path / name
    old = {"w": np.arange(10.0), "v": np.ones(3)}
    jio.export(old, path)
    before = _files(path)
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, "64K")
    calls = {"n": 0}

    def failing(data: Any, local: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 5:
            if where == "start":
                raise _Boom("device lost")
            return _FailsToLand()
        return _host._fresh(data, local)

    monkeypatch.setattr(_host, "copy_start", failing)
    new = {"w": jax.random.normal(KEY, (512, 256)), "v": jax.random.normal(KEY, (512, 256))}
    with pytest.raises(SerializationError, match=r"array 'a\d+\.npy': copying it from .* failed"):
        jio.export(new, path, overwrite=True, compression=compression)
    assert calls["n"] == 5 if where == "start" else calls["n"] >= 5  # copies run ahead
    assert _files(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert_same(old, jio.load(path))


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("", 256 << 20),
        ("1048576", 1 << 20),
        ("64K", 64 << 10),
        ("512MiB", 512 << 20),
        ("2g", 2 << 30),
    ],
)
def test_budget_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, text: str, size: int
) -> None:
    """JAXSTRUCT_HOST_BUDGET takes bytes with an optional K, M or G suffix; unset: 256 MiB."""
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, text)
    assert jio.host_budget() == size


@pytest.mark.parametrize("text", ["lots", "-5", "12T", "100"])
def test_a_bad_budget_is_refused_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streaming: None, text: str
) -> None:
    """A budget that is not a size (or below 4 KiB) fails the export before anything is
    written, with our error naming the variable and the fix."""
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, text)
    with pytest.raises(SerializationError, match=r"JAXSTRUCT_HOST_BUDGET=.*unset it"):
        jio.export({"w": jnp.ones((4, 4))}, tmp_path / "ck")
    assert list(tmp_path.iterdir()) == []


def test_arrays_in_host_memory_keep_the_in_place_path() -> None:
    """Arrays of CPU devices are not streamed unless forced (numpy views them in place)."""
    assert not _host.streams(jnp.ones(3))


def test_a_whole_shard_is_copied_through_a_new_handle() -> None:
    """The copy of a whole shard is a new array object on the same buffer: the host copy JAX
    caches on it goes away with it, never staying on the user's array."""
    x = jax.random.normal(KEY, (8, 8))
    fresh = _host._fresh(x, ((0, 8), (0, 8)))
    assert fresh is not x
    assert np.asarray(fresh).tobytes() == np.asarray(x).tobytes()


def test_regions_cut_an_array_in_c_order_within_the_piece() -> None:
    """Regions tile the array in C order, each at most ``piece`` bytes (rows, or parts of
    one row when a row is larger)."""
    shape, itemsize, piece = (3, 5, 7), 4, 40
    regions = list(_host._regions(shape, itemsize, piece))
    flat = np.arange(np.prod(shape)).reshape(shape)
    seen = np.concatenate([flat[tuple(slice(a, b) for a, b in r)].reshape(-1) for r in regions])
    assert seen.tolist() == list(range(flat.size))
    assert all(np.prod([b - a for a, b in r]) * itemsize <= piece for r in regions)
    assert list(_host._regions((), 4, 40)) == [()]


@pytest.mark.parametrize("compression", ["auto", "deflate"])
def test_a_compressed_export_copies_each_array_from_the_device_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streaming: None, compression: str
) -> None:
    """With a compression, an array is still copied once (beside the few KiB its sample
    takes): stored by "auto" from its sample (weights), it is written as it is copied;
    deflated, its pieces are compressed from that one pass. The files equal the in-place
    path's, pieces and piece table included."""
    weights = jax.random.normal(KEY, (512, 1024), jnp.float32)  # 2 MiB: stored by "auto"
    mask = (weights > 1.5).astype(jnp.int32)  # 2 MiB: deflated, in pieces
    state = {"weights": weights, "mask": mask}
    monkeypatch.setattr(_host, "FORCE_STREAMING", False)
    jio.export(state, tmp_path / "plain", compression=compression)
    monkeypatch.setattr(_host, "FORCE_STREAMING", True)
    copies = _Copies()
    monkeypatch.setattr(_host, "copy_start", copies)
    jio.export(state, tmp_path / "streamed", compression=compression)
    nbytes = 2 * weights.size * 4
    assert nbytes <= copies.copied <= nbytes + 2 * 2 * _host._SAMPLE_BYTES, copies.copied
    assert _files(tmp_path / "streamed") == _files(tmp_path / "plain")
    with zipfile.ZipFile(tmp_path / "streamed" / "arrays.npz") as archive:
        infos = {i.filename: i for i in archive.infolist()}
        assert archive.testzip() is None
    assert infos["a1.npy"].compress_type == zipfile.ZIP_DEFLATED
    assert infos["a1.npy"].extra  # its piece table
    stored = zipfile.ZIP_DEFLATED if compression == "deflate" else zipfile.ZIP_STORED
    assert infos["a0.npy"].compress_type == stored
    assert_same(state, jio.load(tmp_path / "streamed", target=state))


@pytest.mark.parametrize("compression", ["none", "auto", "deflate"])
def test_a_once_member_has_its_chunks_made_once(compression: str) -> None:
    """A ``once`` member's chunks are asked for once whatever the compression: stored from
    its sample, written as they come; deflated, kept deflated even when deflating saved
    nothing (its sample shrinks, the rest is noise: stored, it would be copied again)."""
    rng = np.random.default_rng(35)
    data = rng.integers(0, 256, 3 << 20, np.uint8).tobytes()
    calls = {"n": 0}

    def chunks() -> Any:
        calls["n"] += 1
        view = memoryview(data)
        return [bytes(view[i : i + (1 << 20)]) for i in range(0, len(data), 1 << 20)]

    member = _zip.Member(
        "m.bin", len(data), chunks, stable=True, once=True, sample=lambda: bytes(3 * 8192)
    )  # a sample that misjudges the rest: "auto" deflates, and it saves nothing
    buffer = io.BytesIO()
    buffer.write(b"before")  # the CRC patch lands at the member's place in the stream
    _zip.write_zip(buffer, [member], compression=compression)
    assert calls["n"] == 1
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue()[6:])) as archive:
        assert archive.testzip() is None
        assert archive.read("m.bin") == data
        method = archive.getinfo("m.bin").compress_type
    assert method == (zipfile.ZIP_STORED if compression == "none" else zipfile.ZIP_DEFLATED)


def test_host_pieces_copy_device_shards_through_fresh_arrays(
    monkeypatch: pytest.MonkeyPatch, streaming: None
) -> None:
    """host_pieces and host_array (asynchronous exports, the safetensors and orbax plugins)
    copy shards in accelerator memory through fresh device arrays, never through the
    user's shards, whose cached host copies would keep the model in host memory."""
    copies = _Copies()
    monkeypatch.setattr(_host, "copy_start", copies)
    data = jax.random.normal(KEY, (64, 96), jnp.float32).astype(jnp.bfloat16)
    placed = jax.device_put(data, NamedSharding(_mesh(), P("a", "b")))
    pieces = jio.host_pieces(placed)
    assert copies.calls == 8 and len(pieces) == 8
    whole = jio.host_array(placed)
    assert copies.calls == 16
    assert whole.dtype == data.dtype
    assert whole.tobytes() == np.asarray(data).tobytes()


def test_an_asynchronous_export_copies_through_fresh_arrays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streaming: None
) -> None:
    """export(blocking=False) takes its host snapshot through fresh device arrays too."""
    copies = _Copies()
    monkeypatch.setattr(_host, "copy_start", copies)
    state = {"w": jax.device_put(jax.random.normal(KEY, (64, 96)), NamedSharding(_mesh(), P("a")))}
    handle = jio.export(state, tmp_path / "ck", blocking=False)
    handle.wait()
    assert copies.calls == 4  # one per distinct block: rows over "a", replicated over "b"
    assert_same(state, jio.load(tmp_path / "ck", target=state))


def test_an_asynchronous_snapshot_of_a_device_array_is_its_one_host_copy(
    monkeypatch: pytest.MonkeyPatch, streaming: None
) -> None:
    """The private snapshot export(blocking=False) takes of an array in accelerator memory
    is the fresh host copy itself, not a second copy of it."""
    made: list[Any] = []

    def start(data: Any, local: Any) -> Any:
        made.append(_host._fresh(data, local))
        return made[-1]

    monkeypatch.setattr(_host, "copy_start", start)
    data = jax.random.normal(KEY, (64, 96))
    snapshot = _async.host_copy(data)
    assert len(made) == 1
    assert np.shares_memory(snapshot, np.asarray(made[0]))
    assert snapshot.tobytes() == np.asarray(data).tobytes()


def test_a_failing_copy_in_host_pieces_raises_our_error(
    monkeypatch: pytest.MonkeyPatch, streaming: None
) -> None:
    """A device copy that fails in host_pieces raises our error naming the array's shape."""

    def failing(data: Any, local: Any) -> Any:
        raise _Boom("device lost")

    monkeypatch.setattr(_host, "copy_start", failing)
    with pytest.raises(SerializationError, match=r"shape \(4, 4\).*copying it from .* failed"):
        jio.host_pieces(jnp.ones((4, 4)))
