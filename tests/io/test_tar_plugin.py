"""The example format plugin (jaxstruct-plugin-tar): a third-party format, end to end.

Round trips of every supported value go through it in the shared ``roundtrip``
fixture; these tests cover what is particular to a format: discovery, the
archive's layout, publishing, and hostile files.
"""

from __future__ import annotations

import errno
import importlib.metadata
import io
import tarfile
from pathlib import Path

import jax.numpy as jnp
import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io import _publish
from jaxstruct.registry import SerializationError

VALUE = {"w": np.arange(6.0).reshape(2, 3), "b": jnp.ones(2), "step": 3}


def test_installed_and_discovered_through_its_entry_point() -> None:
    """The distribution advertises a jaxstruct.io entry point and .tar paths use it."""
    eps = importlib.metadata.entry_points(group="jaxstruct.io")
    assert any(ep.dist is not None and ep.dist.name == "jaxstruct-plugin-tar" for ep in eps)
    assert "tar" in jio.PluginRegistry().formats


def test_archive_layout_is_plain_tar_and_reproducible(tmp_path: Path) -> None:
    """Any tar reader lists manifest.json first, then raw array members; bytes repeat exactly."""
    a = jio.export(VALUE, tmp_path / "a.tar")
    b = jio.export(VALUE, tmp_path / "b.tar")
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as archive:
        names = archive.getnames()
        raw = archive.extractfile(names[1])
        assert raw is not None and raw.read() == VALUE["w"].tobytes()
    assert names == ["manifest.json", "w.bin", "b.bin"]
    assert "tar checkpoint" in str(jio.inspect(a))


def test_fortran_order_is_kept(tmp_path: Path) -> None:
    """A Fortran-ordered array is stored as such and comes back Fortran-ordered."""
    value = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    back = jio.load(jio.export(value, tmp_path / "f.tar"))
    assert back.flags.f_contiguous and np.array_equal(back, value)


def test_deflate_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """The format has no compression: asking for it is an error that leaves no file."""
    with pytest.raises(SerializationError, match=r"uncompressed.*\.zip"):
        jio.export(VALUE, tmp_path / "c.tar", compression="deflate")
    assert list(tmp_path.iterdir()) == []


def test_overwrite_and_failed_export_keep_a_checkpoint(tmp_path: Path) -> None:
    """overwrite=True replaces a tar checkpoint; a write failing half-way leaves the old one."""
    path = jio.export({"v": "old"}, tmp_path / "c.tar")
    jio.export({"v": "mid"}, path, overwrite=True)
    assert jio.load(path) == {"v": "mid"}

    def full(name: str) -> None:
        if name == "a.bin":
            raise OSError(errno.ENOSPC, "No space left on device")

    _publish.STEP_HOOK = full
    try:
        with pytest.raises(jio.CheckpointWriteError, match="No space"):
            jio.export({"v": "new", "a": np.ones(3)}, path, overwrite=True)
    finally:
        _publish.STEP_HOOK = None
    assert jio.load(path) == {"v": "mid"}
    assert [p.name for p in tmp_path.iterdir()] == ["c.tar"]


def _rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy the tar at ``src`` to ``dst``, its (TarInfo, bytes) members passed through ``edit``."""
    with tarfile.open(src) as archive:
        members = []
        for info in archive.getmembers():
            data = archive.extractfile(info)
            members.append((info, data.read() if data is not None else b""))
    with tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as out:
        for info, data in edit(members):
            out.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return dst


def _member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: [*m, _member("a9.bin", b"x")], "unexpected members: \\['a9.bin'\\]"),
        (lambda m: m[:-1], "missing members: \\['b.bin'\\]"),
        (lambda m: [*m, m[-1]], "'b.bin' appears twice"),
        (lambda m: [*m[:-1], _member("b.bin", m[-1][1][:-1])], "'b.bin' holds 7 bytes"),
        (lambda m: [m[1], m[0], *m[2:]], "not a checkpoint of any registered format"),
        (lambda m: [m[0], _member("../../etc/passwd", b""), *m[1:]], "unexpected members"),
    ],
)
def test_hostile_archives_are_refused(tmp_path: Path, edit, message: str) -> None:
    """Extra, missing, duplicate, resized and misplaced members are clear errors."""
    good = jio.export(VALUE, tmp_path / "good.tar")
    bad = _rewrite(good, tmp_path / "bad.tar", edit)
    with pytest.raises(SerializationError, match=message):
        jio.load(bad)


def test_links_are_refused(tmp_path: Path) -> None:
    """A symbolic or hard link member is refused before anything is read through it."""
    good = jio.export(VALUE, tmp_path / "good.tar")

    def add_link(members):
        link = tarfile.TarInfo("b.bin")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        return [*members[:-1], (link, b"")]

    with pytest.raises(SerializationError, match=r"'b\.bin' is not a regular file"):
        jio.load(_rewrite(good, tmp_path / "link.tar", add_link))


def test_truncated_archive_and_limits(tmp_path: Path) -> None:
    """A cut-off archive and a manifest above max_manifest_bytes are refused with the fix."""
    good = jio.export(VALUE, tmp_path / "good.tar")
    data = good.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(SerializationError):
        jio.load(cut)
    with pytest.raises(SerializationError, match="max_manifest_bytes="):
        jio.load(good, max_manifest_bytes=16)


def test_a_tar_that_is_not_a_checkpoint_is_left_alone(tmp_path: Path) -> None:
    """Loading an ordinary tar says so; overwrite=True never replaces it."""
    other = tmp_path / "notes.tar"
    with tarfile.open(other, "w") as archive:
        info, data = _member("notes.txt", b"hello")
        archive.addfile(info, io.BytesIO(data))
    before = other.read_bytes()
    with pytest.raises(SerializationError, match="not a checkpoint"):
        jio.load(other)
    with pytest.raises(SerializationError, match="not a jaxstruct tar checkpoint"):
        jio.export(VALUE, other, overwrite=True)
    assert other.read_bytes() == before


def test_members_are_named_by_tree_path(tmp_path: Path) -> None:
    """Array members are named after where each array sits, escaped as array_paths does."""
    value = {"params": {"layers": [{"w": np.ones(2)}], "a.b": np.zeros(1)}}
    with tarfile.open(jio.export(value, tmp_path / "p.tar")) as archive:
        assert archive.getnames() == [
            "manifest.json",
            "params.layers.0.w.bin",
            "params.a%2Eb.bin",
        ]


def test_a_flipped_byte_is_found_on_load_and_by_verify(tmp_path: Path) -> None:
    """Each member's CRC-32 (a PAX record) is checked on every read and by --verify."""
    from jaxstruct.io._inspect import verify_report

    path = jio.export({"w": np.arange(64.0)}, tmp_path / "c.tar")
    assert verify_report(path) == ([], True)
    data = bytearray(path.read_bytes())
    at = data.index(np.arange(64.0).tobytes()) + 100
    data[at] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(SerializationError, match=r"'w\.bin' does not match its checksum"):
        jio.load(path)
    problems, checksummed = verify_report(path)
    assert checksummed and len(problems) == 1 and "checksum" in problems[0]


def test_assert_roundtrip_accepts_the_plugin_format(tmp_path: Path) -> None:
    """assert_roundtrip(x, formats=("tar",)) checks a round trip through a plugin's format."""
    from jaxstruct.testing import assert_roundtrip

    value = {"w": np.asfortranarray(np.arange(6.0).reshape(2, 3)), "b": jnp.ones(2), "s": "x"}
    assert_roundtrip(value, formats=("state_dict", "tar", "zip"), tmp_path=tmp_path)
    assert (tmp_path / "checkpoint-tar.tar").is_file()
    with pytest.raises(ValueError, match=r"unknown format.*'hdf5'"):
        assert_roundtrip(value, formats=("hdf5",))


def test_a_changed_manifest_byte_is_found_and_inspect_says_what_is_checked(
    tmp_path: Path,
) -> None:
    """The manifest member carries its CRC-32 too: a changed byte inside one of its strings
    (still valid JSON) is refused, and inspect reports what the plugin checks."""
    path = jio.export({"w": np.arange(4.0), "tag": "model"}, tmp_path / "c.tar")
    info = jio.inspect(path)
    assert info.checksums == "CRC-32 of every member, the manifest's included"
    data = bytearray(path.read_bytes())
    at = data.index(b"model")
    data[at] = ord("M")
    path.write_bytes(bytes(data))
    with pytest.raises(SerializationError, match=r"manifest\.json does not match its checksum"):
        jio.load(path)
