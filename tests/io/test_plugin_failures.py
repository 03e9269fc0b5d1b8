"""A plugin format that fails costs its user nothing and is named (issue 47), and the
durability API every format shares (issue 46, item 1)."""

from __future__ import annotations

import dataclasses
import errno
import os
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io import PluginRegistry, hookimpl
from jaxstruct.io._builtin import ZipFormat
from jaxstruct.registry import SerializationError

VALUE = {"w": np.arange(3.0)}
NAMED = r"'flaky' format \(plugin 'flaky' from distribution 'dist-flaky'\)"


@dataclasses.dataclass
class _Dist:
    name: str
    version: str = "1.0"


@dataclasses.dataclass
class _EntryPoint:
    name: str
    dist: _Dist
    plugin: Any = None

    def load(self) -> Any:
        return self.plugin


class Flaky(ZipFormat):
    """The zip format, with a write, owns or open that can be made to fail."""

    name = "flaky"
    suffixes = (".flaky",)
    write_error: Callable[[Path], BaseException] | None = None
    beside: str = ""  # a name to create beside the temporary before failing
    owns_error: BaseException | None = None
    open_error: BaseException | None = None

    def write(self, target: Any, manifest: bytes, arrays: Any, **kw: Any) -> None:
        if self.beside:
            (target.parent / self.beside.format(tmp=target.name)).write_bytes(b"debris")
        if self.write_error is not None:
            target.write_bytes(b"half")
            raise self.write_error(target)
        super().write(target, manifest, arrays, **kw)

    def owns(self, path: Path) -> bool:
        if self.owns_error is not None:
            raise self.owns_error
        return super().owns(path)


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> Flaky:
    """A registry holding the built-ins and the 'flaky' plugin format, for this test."""
    fmt = Flaky()
    plugin = types.SimpleNamespace(jaxstruct_register_formats=hookimpl(lambda: [fmt]))
    entry = _EntryPoint("flaky", _Dist("dist-flaky"), plugin)
    registry = PluginRegistry(entry_points=lambda: [entry], autoload=True)
    monkeypatch.setattr(jio._plugins, "_registry", registry)
    return fmt


def _left(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_plugin_write_meeting_a_file_outside_its_temporary_is_its_failure(
    flaky: Flaky, tmp_path: Path
) -> None:
    """A write raising FileExistsError at a path of its own choosing is the plugin's failure,
    named with its distribution (not a disk error), and the user's file stays."""
    user_file = tmp_path / "ck.flaky.part"
    user_file.write_bytes(b"the user's")
    flaky.write_error = lambda _: FileExistsError(errno.EEXIST, "File exists", str(user_file))
    with pytest.raises(SerializationError, match=NAMED) as info:
        jio.export(VALUE, tmp_path / "ck.flaky")
    assert not isinstance(info.value, jio.CheckpointWriteError)
    assert isinstance(info.value.__cause__, FileExistsError)
    assert "outside the temporary" in str(info.value) and str(user_file) in str(info.value)
    assert user_file.read_bytes() == b"the user's"
    assert _left(tmp_path) == ["ck.flaky.part"]  # the temporary is gone


def test_a_plugin_write_on_a_full_disk_is_a_disk_error_naming_the_format(
    flaky: Flaky, tmp_path: Path
) -> None:
    """ENOSPC met by a plugin's write stays a CheckpointWriteError (errno kept), naming the
    format and its distribution; nothing is left."""
    flaky.write_error = lambda _: OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(jio.CheckpointWriteError, match=NAMED) as info:
        jio.export(VALUE, tmp_path / "ck.flaky")
    assert info.value.errno == errno.ENOSPC
    assert _left(tmp_path) == []


def test_what_a_failed_write_made_beside_its_temporary_is_removed(
    flaky: Flaky, tmp_path: Path
) -> None:
    """A sibling named after the temporary (``TMP.part``), which the failed write made, is
    removed with the temporary; the previous checkpoint stays."""
    path = jio.export(VALUE, tmp_path / "ck.flaky")
    flaky.beside = "{tmp}.part"
    flaky.write_error = lambda _: ValueError("plugin bug")
    with pytest.raises(SerializationError, match=NAMED + r".*ValueError: plugin bug"):
        jio.export({"w": np.zeros(2)}, path, overwrite=True)
    assert _left(tmp_path) == ["ck.flaky"]
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])


def test_an_owns_that_raises_during_overwrite_is_the_plugins_failure(
    flaky: Flaky, tmp_path: Path
) -> None:
    """overwrite=True on a sound checkpoint whose format's owns() raises: the plugin's
    failure, chained from its exception; the file is not blamed and stays as it was."""
    path = jio.export(VALUE, tmp_path / "ck.flaky")
    flaky.owns_error = KeyError("header")
    with pytest.raises(SerializationError, match=NAMED + r" failed in owns\(\)") as info:
        jio.export({"w": np.zeros(2)}, path, overwrite=True)
    assert "not a jaxstruct" not in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)
    flaky.owns_error = None
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])


def test_an_open_that_raises_inside_the_default_owns_is_the_plugins_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A format relying on the default owns(), whose open() raises during overwrite=True:
    the plugin's failure, chained; nothing is replaced."""

    class Opening(ZipFormat):
        name = "flaky"
        suffixes = (".flaky",)
        broken = False
        owns = jio.Format.owns

        def open(self, path: Any, limits: Any) -> Any:
            if self.broken:
                raise RuntimeError("cannot open")
            return super().open(path, limits)

    fmt = Opening()
    plugin = types.SimpleNamespace(jaxstruct_register_formats=hookimpl(lambda: [fmt]))
    entry = _EntryPoint("flaky", _Dist("dist-flaky"), plugin)
    registry = PluginRegistry(entry_points=lambda: [entry], autoload=True)
    monkeypatch.setattr(jio._plugins, "_registry", registry)
    path = jio.export(VALUE, tmp_path / "ck.flaky")
    fmt.broken = True
    with pytest.raises(SerializationError, match=NAMED) as info:
        jio.export({"w": np.zeros(2)}, path, overwrite=True)
    assert isinstance(info.value.__cause__, RuntimeError)
    fmt.broken = False
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])


# -- the durability API ------------------------------------------------------------------


def _fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the path of every descriptor fsynced from now on (worker threads too)."""
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return synced


def test_make_durable_fsyncs_every_file_and_directory_under_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """make_durable fsyncs a directory, its subdirectories and their files; a symbolic link
    is not followed."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.bin").write_bytes(b"a")
    (tmp_path / "sub" / "b.bin").write_bytes(b"b")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.write_bytes(b"o")
    (tmp_path / "link").symlink_to(outside)
    synced = _fsynced(monkeypatch)
    jio.make_durable(tmp_path)
    want = {str(tmp_path), str(tmp_path / "sub"), str(tmp_path / "a.bin")}
    assert set(synced) == want | {str(tmp_path / "sub" / "b.bin")}
    synced.clear()
    jio.make_durable(tmp_path / "a.bin")
    assert synced == [str(tmp_path / "a.bin")]


def test_the_builtin_formats_output_is_made_durable_before_it_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Export fsyncs both files and the directory a built-in format wrote, under the
    temporary name, then the parent: the same home as a plugin's output."""
    synced = _fsynced(monkeypatch)
    path = jio.export(VALUE, tmp_path / "ck")
    temp = {s.rpartition("/")[2] for s in synced if ".jaxstruct-tmp-" in s}
    assert {"arrays.npz", "manifest.json"} <= temp
    assert any(s.endswith(tuple(temp)) for s in synced)
    assert synced[-1] == str(tmp_path) and path.is_dir()


def test_flush_while_writing_flushes_from_another_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file written inside the block is flushed by a thread of the call, and once more
    when the block ends."""
    from jaxstruct.io import _publish

    monkeypatch.setattr(_publish, "FLUSH_EVERY_S", 0.0)
    flushed: list[int] = []
    writer = threading.get_ident()
    real = os.fdatasync

    def spy(fd: int) -> None:
        assert threading.get_ident() != writer
        flushed.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    target = tmp_path / "big.bin"
    with open(target, "xb") as file, jio.flush_while_writing(target):
        file.write(bytes(1 << 20))
    assert flushed and set(flushed) == {target.stat().st_ino}
