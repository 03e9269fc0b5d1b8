"""The zip index: the quick parser of simple archives agrees with :mod:`zipfile` on every
archive it accepts, defers everything else to it, and small archives are read with one call."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxstruct.io import _zip
from jaxstruct.registry import SerializationError


def _archive(members: dict[str, bytes], **options: Any) -> bytes:
    buffer = io.BytesIO()
    comment = options.pop("comment", b"")
    with zipfile.ZipFile(buffer, "w", **options) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.comment = comment
    return buffer.getvalue()


def _records(data: bytes) -> tuple[Any, Any]:
    """What the quick parser finds (None: deferred) and what zipfile finds (or its error type)."""
    quick = _zip._simple_records(lambda offset, n: data[offset : offset + n], len(data))
    path = Path(os.environ.get("TMPDIR", "/tmp"))
    fd = os.memfd_create("archive") if hasattr(os, "memfd_create") else None
    if fd is None:  # pragma: no cover - not Linux
        pytest.skip("needs memfd_create")
    try:
        os.write(fd, data)
        try:
            full: Any = _zip._zipfile_records(fd, len(data), 0, str(path))
        except SerializationError as err:
            full = type(err)
    finally:
        os.close(fd)
    return quick, full


def test_quick_parser_reads_what_export_writes(tmp_path: Path) -> None:
    """The archives export writes take the quick path, and it finds what zipfile finds."""
    path = jio.export({"a": np.arange(3.0), "é": np.ones(2, np.int8)}, tmp_path / "ck")
    data = (path / "arrays.npz").read_bytes()
    quick, full = _records(data)
    assert quick is not None and quick == full
    assert sorted(r[0] for r in quick) == ["a0.npy", "a1.npy"]


@pytest.mark.parametrize(
    "options",
    [
        {"comment": b"a comment"},  # the end record is not last
        {"compression": zipfile.ZIP_DEFLATED},  # fine: still simple
        {"compression": zipfile.ZIP_STORED},
    ],
)
def test_archives_from_zipfile(options: dict[str, Any]) -> None:
    """Archives zipfile writes: the quick parser agrees with it or defers to it."""
    data = _archive({"x.npy": b"12345", "dir/y.npy": b""}, **options)
    quick, full = _records(data)
    if "comment" in options:
        assert quick is None
    else:
        assert quick == full


def test_zip64_and_extra_fields_are_deferred() -> None:
    """np.savez writes ZIP64 extra fields: those archives go to zipfile, and still load."""
    buffer = io.BytesIO()
    np.savez(buffer, a=np.arange(4))
    quick, full = _records(buffer.getvalue())
    assert isinstance(full, list) and [r[0] for r in full] == ["a.npy"]
    assert quick is None or quick == full


@given(
    members=st.dictionaries(
        st.text(
            st.characters(min_codepoint=32, exclude_characters="/\\", exclude_categories=["Cs"]),
            min_size=1,
            max_size=12,
        ),
        st.binary(max_size=40),
        min_size=1,
        max_size=4,
    ),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=3),
    cut=st.integers(0, 64),
)
@settings(max_examples=400)
def test_mutated_archives_quick_path_never_disagrees(
    members: dict[str, bytes], flips: list[tuple[int, int]], cut: int
) -> None:
    """Whatever the bytes, the quick parser either defers or finds exactly what zipfile finds."""
    data = bytearray(_archive(members))
    for pos, mask in flips:
        data[pos % len(data)] ^= mask
    data = bytes(data[: len(data) - cut] if cut < len(data) else data)
    quick, full = _records(data)
    if quick is not None:
        assert quick == full


def test_mutations_are_mostly_taken_by_the_quick_path() -> None:
    """The differential test above is not vacuous: most one-byte flips stay on the quick path
    (a flip in a member's data or CRC field), and those include a version zipfile refuses."""
    import random

    rng = random.Random(7)
    quick_taken = 0
    for _ in range(300):
        data = bytearray(_archive({"a.npy": rng.randbytes(30), "b.npy": b"xy"}))
        data[rng.randrange(len(data))] ^= rng.randint(1, 255)
        quick, full = _records(bytes(data))
        if quick is not None:
            quick_taken += 1
            assert quick == full
    assert quick_taken > 100
    data = bytearray(_archive({"a.npy": b"1"}))
    central = data.find(b"PK\x01\x02")
    data[central + 6] = 64  # "version needed to extract" 6.4: zipfile refuses it
    assert _records(bytes(data)) == (None, SerializationError)


@pytest.mark.parametrize("name", ["ck", "ck.zip"])
def test_small_checkpoint_is_read_with_one_call_per_file(name: str, tmp_path: Path) -> None:
    """A small checkpoint's files are each read once, whole: the zip directories, the
    (deflated) manifest, the stored arrays.npz and its members all come from those copies.
    (A .zip is sniffed first: 4 bytes.)"""
    value = {f"a{i}": np.arange(i + 1.0) for i in range(10)}
    path = jio.export(value, tmp_path / name)
    if path.is_dir():
        want = [(path / f).stat().st_size for f in ("manifest.json", "arrays.npz")]
    else:
        want = [4, path.stat().st_size]
    with pytest.MonkeyPatch.context() as patch:
        sizes: list[int] = []
        real = os.pread

        def counting(fd: int, n: int, offset: int) -> bytes:
            sizes.append(n)
            return real(fd, n, offset)

        patch.setattr(os, "pread", counting)
        back = jio.load(path)
    assert all(np.array_equal(back[k], v) for k, v in value.items())
    assert sizes == want


def test_quick_path_checks_still_hold(tmp_path: Path) -> None:
    """A corrupt member of a small archive is still caught by its CRC, from memory."""
    path = jio.export({"a": np.array([1.5, -7.25])}, tmp_path / "ck")
    npz = path / "arrays.npz"
    data = bytearray(npz.read_bytes())
    pos = data.find(np.array([1.5, -7.25]).tobytes())
    data[pos + 3] ^= 0x10
    npz.write_bytes(bytes(data))
    with pytest.raises(SerializationError, match="CRC"):
        jio.load(path)
