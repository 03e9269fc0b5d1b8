"""Deflated members in pieces: written and inflated on every core, every piece checked."""

from __future__ import annotations

import io
import struct
import threading
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any

import jax
import jaxstruct.io as jio
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io import _pieces, _zip
from jaxstruct.io._builtin import DirectoryFormat
from jaxstruct.io._inspect import verify_report
from jaxstruct.io._schema import Limits
from jaxstruct.registry import SerializationError

ROWS, COLS = 900, 1000  # 3.6 MB of float32: four pieces, rows straddling their bounds


def _data(seed: int = 0) -> np.ndarray:
    # Small integers as floats: they deflate well, and no two pieces are alike.
    rng = np.random.default_rng(seed)
    return rng.integers(0, 16, (ROWS, COLS)).astype(np.float32)


def _central_extra(archive: Path, member: str) -> tuple[int, bytes]:
    """The file offset of ``member``'s central directory extra field, and the field."""
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo(member)
    raw = archive.read_bytes()
    name = member.encode()
    pos = 0
    while True:
        pos = raw.index(b"PK\x01\x02", pos)
        name_len, extra_len = struct.unpack_from("<HH", raw, pos + 28)
        if raw[pos + 46 : pos + 46 + name_len] == name:
            start = pos + 46 + name_len
            assert raw[start : start + extra_len] == info.extra
            return start, info.extra
        pos += 4


def _member_data_offset(archive: Path, member: str) -> tuple[int, int]:
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo(member)
    raw = archive.read_bytes()
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
    return info.header_offset + 30 + name_len + extra_len, info.compress_size


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x10
    path.write_bytes(bytes(raw))


@pytest.fixture
def pieced(tmp_path: Path) -> Path:
    return jio.export({"w": _data()}, tmp_path / "ck", compression="deflate")


def test_big_deflated_member_is_written_in_pieces_numpy_reads(pieced: Path) -> None:
    """A deflated member over one piece records its pieces; numpy.load and zipfile read it."""
    archive = pieced / "arrays.npz"
    found = _pieces.find_block(_central_extra(archive, "a0.npy")[1])
    assert found is not None and found[0]
    table = _pieces.parse_table(found[0], *_sizes(archive, "a0.npy"), fail=SerializationError)
    # the .npy header is a piece of its own; the array's 3.6 MB take four more
    assert table.count == 5 and table.first == 128
    with zipfile.ZipFile(archive) as zf:
        assert zf.testzip() is None
    with np.load(archive, allow_pickle=False) as npz:
        np.testing.assert_array_equal(npz["a0"], _data())
    np.testing.assert_array_equal(jio.load(pieced)["w"], _data())


def _sizes(archive: Path, member: str) -> tuple[int, int, int]:
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo(member)
    return info.file_size, info.compress_size, info.CRC


def test_member_of_one_piece_has_no_table(tmp_path: Path) -> None:
    """Pieces start above one piece's size: smaller members are plain DEFLATE streams."""
    path = jio.export({"w": np.zeros(1000, np.float32)}, tmp_path / "ck", compression="deflate")
    with zipfile.ZipFile(path / "arrays.npz") as zf:
        assert zf.getinfo("a0.npy").extra == b""


def test_pieces_are_inflated_and_deflated_on_several_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Export deflates the pieces on the pool; load inflates them on the pool and this thread."""
    seen: dict[str, set[str]] = {"deflate": set(), "inflate": set()}
    deflate, inflate = _pieces.deflate_piece, _pieces.inflate_piece

    def spy_deflate(*args: Any) -> Any:
        seen["deflate"].add(threading.current_thread().name)
        return deflate(*args)

    def spy_inflate(*args: Any) -> Any:
        seen["inflate"].add(threading.current_thread().name)
        time.sleep(0.02)  # leave the helpers time to take a piece
        return inflate(*args)

    monkeypatch.setattr(_pieces, "deflate_piece", spy_deflate)
    monkeypatch.setattr(_pieces, "inflate_piece", spy_inflate)
    monkeypatch.setattr(_pieces, "WORKERS", 2)
    path = jio.export({"w": _data()}, tmp_path / "ck.zip", compression="deflate")
    np.testing.assert_array_equal(jio.load(path)["w"], _data())
    # (the manifest is deflated on this thread; the array's pieces on the pool)
    assert any(n.startswith("jaxstruct-io") for n in seen["deflate"]), seen
    assert len(seen["inflate"]) >= 2, seen


@pytest.mark.parametrize("where", [0.1, 0.5, 0.95])
def test_flipped_byte_in_a_piece_fails_naming_the_member(pieced: Path, where: float) -> None:
    """A corrupt piece fails the load (and verify) with our error naming the member."""
    archive = pieced / "arrays.npz"
    start, csize = _member_data_offset(archive, "a0.npy")
    _flip(archive, start + int(csize * where))
    with pytest.raises(SerializationError, match=r"'a0\.npy'"):
        jio.load(pieced)
    assert any("'a0.npy'" in problem for problem in verify_report(pieced)[0])


@pytest.mark.parametrize("field", ["count", "first", "length", "crc", "log2"])
def test_flipped_byte_in_the_piece_table_fails_naming_the_member(pieced: Path, field: str) -> None:
    """The recorded pieces must match the member's sizes and CRC, or the load fails."""
    archive = pieced / "arrays.npz"
    start, extra = _central_extra(archive, "a0.npy")
    at = extra.index(struct.pack("<H", _pieces.EXTRA_ID)) + 4  # the block's body
    at += {"log2": 1, "count": 2, "first": 6, "length": 10 + 8 + 1, "crc": 10 + 8 + 4 + 2}[field]
    _flip(archive, start + at)
    with pytest.raises(SerializationError, match=r"'a0\.npy'.*piece table"):
        jio.load(pieced)


def test_zip_checkpoint_pieces_load_and_fail_alike(tmp_path: Path) -> None:
    """Inside a .zip checkpoint (arrays.npz nested, stored) pieces load and are checked too."""
    path = jio.export({"w": _data()}, tmp_path / "ck.zip", compression="deflate")
    np.testing.assert_array_equal(jio.load(path)["w"], _data())
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10  # inside the member's compressed bytes
    path.write_bytes(bytes(raw))
    with pytest.raises(SerializationError, match=r"'a0\.npy'"):
        jio.load(path)


@pytest.mark.parametrize("spec", ["rows", "columns", "both", "replicated"])
@pytest.mark.parametrize("suffix", ["", ".zip"], ids=["directory", "zip"])
def test_sharded_load_of_pieced_member(spec: str, suffix: str, tmp_path: Path) -> None:
    """A load placed with a sharding reads a member deflated in pieces exactly, and checks it."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    pspec = {"rows": P("x"), "columns": P(None, "y"), "both": P("x", "y"), "replicated": P()}
    host = _data()[:896]  # rows split evenly by four
    path = jio.export({"w": host}, tmp_path / f"ck{suffix}", compression="deflate")
    sharding = NamedSharding(mesh, pspec[spec])
    target = {"w": jax.ShapeDtypeStruct(host.shape, host.dtype, sharding=sharding)}
    back = jio.load(path, target=target)["w"]
    assert back.sharding == sharding
    np.testing.assert_array_equal(np.asarray(back), host)
    archive = path / "arrays.npz" if suffix == "" else path
    if suffix == "":
        start, csize = _member_data_offset(archive, "a0.npy")
        _flip(archive, start + csize // 2)
    else:
        raw = bytearray(archive.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        archive.write_bytes(bytes(raw))
    with pytest.raises(SerializationError, match=r"'a0\.npy'"):
        jio.load(path, target=target)


def test_skipping_rows_inflates_only_the_pieces_needed(
    pieced: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skipped bytes of a pieced member are not inflated where whole pieces hold only them."""
    calls: list[int] = []
    inflate = _pieces.inflate_piece

    def spy(source: Any, table: Any, i: int, fail: Any) -> bytes:
        calls.append(i)
        return inflate(source, table, i, fail)

    monkeypatch.setattr(_pieces, "inflate_piece", spy)
    ck = DirectoryFormat().open(pieced, Limits())
    try:
        entry = ck.index.entries["a0.npy"]
        reader = _zip.MemberReader(ck.fd, entry, ck.where, ck.index)
        assert reader.pieced
        tail = 1000
        reader.skip(entry.size - tail)
        got = reader.read(tail)
        reader.finish()
    finally:
        ck.close()
    assert calls == [4]  # the last piece alone (the header is piece 0)
    assert got == _data().tobytes()[-tail:]


def test_member_whose_chunks_reuse_one_buffer_is_deflated_right(tmp_path: Path) -> None:
    """A member whose chunks() hands out one reused buffer (streaming) is copied piece by piece."""
    data = _data().tobytes()
    step = 300_000

    def chunks() -> Any:
        buf = bytearray(step)
        for pos in range(0, len(data), step):
            piece = data[pos : pos + step]
            buf[: len(piece)] = piece
            yield memoryview(buf)[: len(piece)]

    member = _zip.Member("x.bin", len(data), chunks)
    big = _zip.Member("y.bin", len(data), lambda: [data], parts=[data], stable=True)
    target = tmp_path / "a.zip"
    with open(target, "wb") as handle:
        _zip.write_zip(handle, [member, big], compression="deflate")
    with zipfile.ZipFile(target) as zf:
        assert zf.read("x.bin") == data
        assert zf.read("y.bin") == data
        assert zf.getinfo("x.bin").compress_type == zipfile.ZIP_DEFLATED


def test_auto_stores_weights_and_deflates_what_shrinks_a_lot(tmp_path: Path) -> None:
    """compression="auto": random bf16 and float32 weights stored; zeros and masks deflated."""
    rng = np.random.default_rng(0)
    arrays = {
        "bf16": rng.standard_normal(200_000).astype(ml_dtypes.bfloat16),
        "f32": rng.standard_normal(100_000).astype(np.float32),
        "zeros": np.zeros(100_000, np.float32),
        "mask": rng.random(400_000) < 0.01,
    }
    path = jio.export(arrays, tmp_path / "ck")
    with zipfile.ZipFile(path / "arrays.npz") as zf:
        methods = {i.filename: i.compress_type for i in zf.infolist()}
    stored, deflated = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED
    assert methods == {"a0.npy": stored, "a1.npy": stored, "a2.npy": deflated, "a3.npy": deflated}
    back = jio.load(path)
    for key, arr in arrays.items():
        assert back[key].tobytes() == arr.tobytes()


def test_piece_size_keeps_the_table_small() -> None:
    """A member never has more than MAX_PIECES pieces: the table fits an extra field."""
    assert _pieces.piece_size(1) == _pieces.PIECE
    assert _pieces.piece_size(_pieces.PIECE * _pieces.MAX_PIECES) == _pieces.PIECE
    big = _pieces.PIECE * _pieces.MAX_PIECES + 1
    assert _pieces.piece_size(big) == 2 * _pieces.PIECE
    assert -(-(1 << 40) // _pieces.piece_size(1 << 40)) <= _pieces.MAX_PIECES
    table = _pieces.encode_table(
        _pieces.PIECE, 1, [1] * _pieces.MAX_PIECES, [0] * _pieces.MAX_PIECES
    )
    assert len(table) + 28 < 0xFFFF  # with a ZIP64 block beside it


def test_load_inflates_members_while_it_reads_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain load hands each member's pieces to the pool and goes on to the next member;
    a corrupt piece of the first member still fails the load, naming it."""
    waits: list[bool] = []
    inflate_into = _pieces.inflate_into

    def spy(*args: Any, wait: bool = True) -> Any:
        waits.append(wait)
        return inflate_into(*args, wait=wait)

    monkeypatch.setattr(_pieces, "inflate_into", spy)
    data = {"a": _data(1), "b": _data(2)}
    path = jio.export(data, tmp_path / "ck", compression="deflate")
    back = jio.load(path)
    np.testing.assert_array_equal(back["a"], data["a"])
    np.testing.assert_array_equal(back["b"], data["b"])
    assert waits == [False, False]
    archive = path / "arrays.npz"
    start, csize = _member_data_offset(archive, "a0.npy")
    _flip(archive, start + csize // 2)
    with pytest.raises(SerializationError, match=r"'a0\.npy'"):
        jio.load(path)


def test_select_reads_only_the_chosen_pieced_member(tmp_path: Path) -> None:
    """select= of one array reads that member's pieces, and a corrupt other member is not read."""
    data = {"a": _data(1), "b": _data(2)}
    path = jio.export(data, tmp_path / "ck", compression="deflate")
    archive = path / "arrays.npz"
    start, csize = _member_data_offset(archive, "a0.npy")
    _flip(archive, start + csize // 2)
    np.testing.assert_array_equal(jio.load(path, select=lambda v: v["b"]), data["b"])
    with pytest.raises(SerializationError, match=r"'a0\.npy'"):
        jio.load(path, select=lambda v: v["a"])


@pytest.mark.parametrize("level", [1, 6])
@pytest.mark.parametrize("strategy", ["rle", "default"])
def test_a_pieces_deflated_bytes_do_not_depend_on_where_its_input_is_cut(
    strategy: str, level: int
) -> None:
    """A piece deflates to the same bytes fed whole (from memory) or in the pieces a device
    copy or a streaming writer hands over: zlib-ng's default strategy otherwise gives
    other bytes for other cuts, and streamed exports would differ from in-place ones."""
    from zlib_ng import zlib_ng

    code = zlib_ng.Z_RLE if strategy == "rle" else zlib_ng.Z_DEFAULT_STRATEGY
    data = _data(3).tobytes()[: 1 << 20]
    whole = _pieces.deflate_piece([data], code, level, True)
    rng = np.random.default_rng(7)
    for _ in range(3):
        cuts = sorted(set(rng.integers(1, len(data), 40).tolist()))
        segments = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        written: list[bytes] = []
        streamed = _pieces.Deflater(code, level, written.append)
        for segment in segments:
            streamed.feed(segment)
        streamed.finish(True)
        assert _pieces.deflate_piece(segments, code, level, True) == whole
        assert (streamed.crc, b"".join(written)) == (whole[0], b"".join(whole[1]))


def test_auto_stores_a_member_whose_deflating_saved_nothing(tmp_path: Path) -> None:
    """A member whose sample deflates well but the rest not at all: "auto" deflated it as it
    wrote it, then goes back and stores it (bytes already flushed to the file included), and
    the members after it land right."""
    rng = np.random.default_rng(46)
    noise = bytearray(rng.integers(0, 256, 3 << 20, np.uint8).tobytes())
    # Where the sample looks: runs and a repeated pattern, which the default strategy
    # deflates best; it makes random bytes 5% larger.
    sample = bytes(6144) + bytes(range(256)) * 8
    for at in (0, (len(noise) - 8192) // 2, len(noise) - 8192):
        noise[at : at + 8192] = sample
    after = bytes(200_000)
    members = [
        _zip.Member.of("noise.bin", [b"head", bytes(noise)]),
        _zip.Member.of("zeros.bin", [after]),
    ]
    target = tmp_path / "a.zip"
    with open(target, "wb", buffering=0) as handle:
        handle.write(b"prefix")  # the archive starts inside the file (as arrays.npz does)
        size, crc = _zip.write_zip(handle, members, compression="auto")
    blob = target.read_bytes()[6:]
    assert (len(blob), zlib.crc32(blob)) == (size, crc)
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        assert zf.testzip() is None
        assert zf.getinfo("noise.bin").compress_type == zipfile.ZIP_STORED
        assert zf.getinfo("zeros.bin").compress_type == zipfile.ZIP_DEFLATED
        assert zf.read("noise.bin") == b"head" + bytes(noise)
        assert zf.read("zeros.bin") == after
