"""jaxstruct's own checksums of arrays (pieces, CRC-32s, multi-process merge) and the seal."""

from __future__ import annotations

import itertools
import math
import zlib

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io import _checksums, to_state_dict
from jaxstruct.io._encode import dump_manifest
from jaxstruct.io._schema import parse_manifest
from jaxstruct.registry import SerializationError


def _reference(arr: np.ndarray, piece: int = _checksums.PIECE) -> list[int]:
    """The pieces' CRC-32s the slow way: each piece copied out in C order."""
    boxes = _checksums.pieces(arr.shape, arr.dtype.itemsize, piece)
    return [
        zlib.crc32(np.ascontiguousarray(arr[tuple(slice(a, b) for a, b in box)]).tobytes())
        for box in boxes
    ]


def _hex(crcs: list[int]) -> str:
    return "".join(f"{c:08x}" for c in crcs)


@given(
    shape=st.lists(st.integers(0, 9), max_size=4).map(tuple),
    itemsize=st.sampled_from([1, 2, 4, 8, 16]),
    piece=st.sampled_from([1, 8, 16, 64, 1000]),
)
def test_pieces_cut_the_array_in_c_order_into_boxes_of_at_most_a_piece(
    shape: tuple[int, ...], itemsize: int, piece: int
) -> None:
    """Pieces are boxes that follow one another in C order, cover every element once and
    hold at most one piece of bytes (or one element)."""
    boxes = _checksums.pieces(shape, itemsize, piece)
    flat = np.arange(math.prod(shape)).reshape(shape)
    order = np.concatenate(
        [flat[tuple(slice(a, b) for a, b in box)].reshape(-1) for box in boxes] or [[]]
    )
    assert order.tolist() == list(range(math.prod(shape)))
    for box in boxes:
        size = math.prod(b - a for a, b in box) * itemsize
        assert size <= max(piece, itemsize) or not shape


def test_a_scalar_is_one_piece_and_an_empty_array_has_no_bytes_checked() -> None:
    """A 0-d array is one piece; an array with a zero dimension has no bytes in any piece."""
    assert _checksums.pieces((), 4) == [()]
    assert all(math.prod(b - a for a, b in box) == 0 for box in _checksums.pieces((3, 0), 4))


DTYPES = [
    np.float32,
    np.float64,
    np.int8,
    np.uint16,
    np.bool_,
    np.complex64,
    ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.int4,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (300, 1100), (3, 700_000)], ids=str)
def test_checksums_are_the_crcs_of_each_piece_whatever_the_memory_order(
    dtype: type, shape: tuple[int, ...]
) -> None:
    """The recorded CRC-32s are those of each piece's C-order bytes, for C and Fortran
    arrays alike."""
    rng = np.random.default_rng(0)
    arr = np.asarray(rng.integers(0, 7, size=shape).astype(dtype))
    expected = _hex(_reference(arr))
    for held in (arr, np.asfortranarray(arr)):
        section = _checksums.checksum_arrays({"a": held}, "x")
        assert section["by"] == "jaxstruct" and section["piece"] == _checksums.PIECE
        assert section["crc32"]["a"] == expected


@pytest.mark.parametrize(
    "spec", [P("x", None), P(None, "y"), P("x", "y"), P("y", "x"), P(None, None)], ids=str
)
def test_a_sharded_array_gives_the_crcs_of_the_whole(spec: P) -> None:
    """Shards on any sharding give the same CRC-32s as the whole array on the host."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    arr = np.random.default_rng(1).standard_normal((512, 1536)).astype(np.float32)
    placed = jax.device_put(arr, NamedSharding(mesh, spec))
    assert _checksums.checksum_arrays({"a": placed}, "x")["crc32"]["a"] == _hex(_reference(arr))


def test_parts_held_by_several_processes_merge_into_the_piece_crc() -> None:
    """The CRC-32 of a piece comes back from its parts, each the piece with the others'
    bytes as zeros (what each process of a multi-process run computes)."""
    rng = np.random.default_rng(2)
    piece = rng.integers(0, 256, 5000, dtype=np.uint8)
    cuts = [0, 1234, 1234, 4000, 5000]  # four holders, one of them holding nothing
    parts: list[int | None] = []
    for a, b in itertools.pairwise(cuts):
        if a == b:
            parts.append(None)
            continue
        zeroed = np.zeros_like(piece)
        zeroed[a:b] = piece[a:b]
        parts.append(zlib.crc32(zeroed.tobytes()))
    assert _checksums.merge(parts, piece.nbytes) == zlib.crc32(piece.tobytes())
    assert _checksums.merge([None, None], 16) == zlib.crc32(bytes(16))


def _expected(arr: np.ndarray) -> _checksums.Expected:
    spec = to_state_dict(arr)["arrays"]["a0"]
    section = _checksums.checksum_arrays({"a0": arr}, "x")
    return _checksums.Expected(section, {"a0": _spec(spec)}, "'ckpt'", lambda: {"a0": "params.w"})


def _spec(entry: dict[str, object]) -> object:
    from jaxstruct.io import ArraySpec

    dtype = np.dtype(str(entry["dtype"]))
    shape = tuple(entry["shape"])  # type: ignore[arg-type]
    return ArraySpec(dtype, shape, math.prod(shape) * dtype.itemsize)


def test_many_small_arrays_are_checksummed_on_several_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Arrays of a few pieces each are batched together across arrays onto the worker
    pool (a model of many 8 MiB weights keeps every core busy), in the arrays' order."""
    from jaxstruct.io import _process

    tasks = []
    submit = _process.submit

    def counting(pool: object, fn: object) -> object:
        tasks.append(fn)
        return submit(pool, fn)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(_process, "submit", counting)
    rng = np.random.default_rng(3)
    arrays = {f"a{i}": rng.integers(0, 255, (3, 1 << 20), np.uint8) for i in range(12)}
    section = _checksums.checksum_arrays(arrays, "x")
    assert len(tasks) >= 2
    assert section["crc32"] == {k: _hex(_reference(a)) for k, a in arrays.items()}
    assert list(section["crc32"]) == list(arrays)


def test_a_flipped_byte_is_found_and_named() -> None:
    """Checking a read array that differs in one byte names the file, the array's tree path,
    the piece and the fix."""
    arr = np.arange(600_000, dtype=np.float32).reshape(1000, 600)
    expected = _expected(arr)
    expected.check({"a0": arr}, "the format")
    bad = arr.copy()
    bad.view(np.uint8).reshape(-1)[1_500_000] ^= 4
    with pytest.raises(SerializationError, match=r"'ckpt': array 'params.w' \(a0\).*piece 1 of 3"):
        expected.check({"a0": bad}, "the format")


def test_a_checksums_section_not_covering_the_arrays_is_refused() -> None:
    """A recorded section whose CRC-32s are missing, extra or of the wrong count is refused."""
    arr = np.ones(10, np.float32)
    table = {"a0": _spec({"dtype": "<f4", "shape": [10]})}
    good = _checksums.checksum_arrays({"a0": arr}, "x")
    for crcs in ({}, {"a0": good["crc32"]["a0"], "a1": "00000000"}, {"a0": "0" * 16}):
        with pytest.raises(SerializationError, match="checksums"):
            _checksums.Expected({**good, "crc32": crcs}, table, "x")


def _manifest() -> bytes:
    state = to_state_dict({"w": np.ones(3, np.float32), "name": "run"})
    return dump_manifest(state, "zip", _checksums.checksum_arrays(state["array_data"], "x"))


def test_every_single_bit_flip_of_a_manifest_is_refused_or_harmless() -> None:
    """No single flipped bit of a sealed manifest parses into anything but the manifest
    written: each raises our error, or (a flip in trailing whitespace) changes nothing."""
    data = _manifest()
    original = parse_manifest(data, "x")
    harmless = 0
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        try:
            parsed = parse_manifest(bytes(flipped), "x")
        except SerializationError:
            continue
        assert parsed == original, f"bit {bit} parsed into another manifest"
        harmless += 1
    assert harmless <= 8  # the final newline only


def test_a_manifest_of_version_2_without_its_seal_is_refused() -> None:
    """Removing the seal (or a flip in its key) does not turn checking off: refused."""
    data = _manifest()
    body = data[: data.rindex(b',"seal"')] + b"}"
    with pytest.raises(SerializationError, match="lost its seal"):
        parse_manifest(body, "x")


def test_a_version_1_manifest_still_parses() -> None:
    """Manifests written before seals and checksums (format version 1) still load."""
    data = (
        b'{"format":"jaxstruct","version":1,"container":"zip",\n"arrays":{},\n'
        b'"manifest":{"root":0,"nodes":[\n["none"]]}}\n'
    )
    assert parse_manifest(data, "x")["version"] == 1
