"""Untrusted safetensors files: limits before allocation, fuzzed headers give our errors only."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path

import jaxstruct.io as jio
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jaxstruct.registry import SerializationError
from jaxstruct.safetensors import _header


def _file(header: dict | bytes, data: bytes = b"") -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _valid() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = jio.export(
            {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2, np.int8)},
            Path(d) / "v.safetensors",
        )
        return path.read_bytes()


VALID = _valid()
TARGET = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(2, np.int8)}


def _load(tmp: Path, blob: bytes, **kw) -> object:
    path = tmp / "x.safetensors"
    path.write_bytes(blob)
    return jio.load(path, format="safetensors", **kw)


def test_header_length_is_checked_before_it_is_read(tmp_path: Path, monkeypatch) -> None:
    """A header larger than max_manifest_bytes is refused before any of it is read."""
    reads: list[int] = []
    real = _header.read_header

    def spy(file, limits, where):
        original = file.read

        def read(n=-1):
            reads.append(n)
            return original(n)

        file.read = read
        return real(file, limits, where)

    monkeypatch.setattr("jaxstruct.safetensors._format.read_header", spy)
    blob = struct.pack("<Q", 1 << 20) + b"{" + b" " * ((1 << 20) - 2) + b"}"
    with pytest.raises(SerializationError, match="more than max_manifest_bytes"):
        _load(tmp_path, blob, max_manifest_bytes=1 << 19)
    assert reads == [8]


def test_a_header_length_beyond_the_file_is_damage(tmp_path: Path) -> None:
    """A header length the file cannot hold (a flipped high bit) is reported as a damaged
    file before any limit (whose advice would be to raise it)."""
    blob = struct.pack("<Q", 1 << 40) + b"{}"
    with pytest.raises(SerializationError, match=r"does not fit the file's 10 bytes.*restore"):
        _load(tmp_path, blob)


def test_tensor_bytes_are_limited_before_allocation(tmp_path: Path) -> None:
    with pytest.raises(SerializationError, match="more than max_array_bytes=16"):
        _load(tmp_path, VALID, target=TARGET, max_array_bytes=16)


def test_tensor_count_is_limited(tmp_path: Path) -> None:
    with pytest.raises(SerializationError, match="more than max_nodes=1"):
        _load(tmp_path, VALID, max_nodes=1)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, "needs 16 bytes"),
        ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4000]}}, "outside the file"),
        ({"t": {"dtype": "X9", "shape": [1], "data_offsets": [0, 4]}}, "does not read"),
        ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, "malformed shape"),
        (
            {
                "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]},
            },
            "overlap",
        ),
        ({"__metadata__": {"k": 1}}, "strings to strings"),
        # (The safetensors library itself keeps the last of two equal keys.)
        (b'{"t": 1, "t": 2}', "malformed safetensors header: duplicate JSON key 't'"),
        (
            b'{"__metadata__": {"k": "a", "k": "b"}}',
            "malformed safetensors header: duplicate JSON key 'k'",
        ),
        (b'{"t": NaN}', "JSON literal NaN is not allowed"),
        (b"\xff\xfe", "safetensors header is not UTF-8 text"),
        (b'{"t": ', "safetensors header is not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
    ],
)
def test_malformed_headers_are_named(tmp_path: Path, header: dict | bytes, message: str) -> None:
    with pytest.raises(SerializationError, match=message):
        _load(tmp_path, _file(header, b"\0" * 8), target={"t": np.zeros(1)})


def test_a_truncated_file_is_our_error(tmp_path: Path) -> None:
    with pytest.raises(SerializationError):
        _load(tmp_path, VALID[:-5], target=TARGET)


@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8
    ),
    cut=st.one_of(st.none(), st.integers(0, len(VALID))),
)
def test_fuzzed_files_give_only_our_errors(edits: list[tuple[int, int]], cut: int | None) -> None:
    """Any byte changes (header length, JSON, metadata, data) or truncation: a value or ours."""
    blob = bytearray(VALID)
    for at, byte in edits:
        blob[at] = byte
    if cut is not None:
        blob = blob[:cut]
    with tempfile.TemporaryDirectory() as d:
        for kw in ({}, {"target": TARGET}):
            try:
                _load(Path(d), bytes(blob), **kw)
            except SerializationError:
                pass


@given(
    document=st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=12,
    )
)
def test_fuzzed_json_headers_give_only_our_errors(document: object) -> None:
    """Arbitrary JSON in place of the header, or inside a tensor entry: only our errors."""
    with tempfile.TemporaryDirectory() as d:
        for header in (document, {"t": document}, {"__metadata__": document}):
            try:
                _load(
                    Path(d),
                    _file(json.dumps(header).encode(), b"\0" * 16),
                    target={"t": np.zeros(1)},
                )
            except SerializationError:
                pass
