"""Never losing a checkpoint: atomic publish, overwrite, kill -9, full disk, racing writers."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io import _publish
from jaxstruct.registry import SerializationError

# A server process imports jaxstruct.io once, then forks one child per export so
# that each kill -9 costs a fork rather than a fresh interpreter.
SERVER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import numpy as np
    import jaxstruct.io as jio
    from jaxstruct.io import _publish

    def value(tag, size):
        rng = np.random.default_rng(len(tag))
        return {"tag": tag, "arrays": [rng.standard_normal(size) for _ in range(6)]}

    for line in sys.stdin:
        cmd = json.loads(line)
        pid = os.fork()
        if pid == 0:
            if cmd["kill_at"] is not None:
                def hook(name, kill_at=cmd["kill_at"]):
                    if name == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)
                _publish.STEP_HOOK = hook
            try:
                jio.export(value(cmd["tag"], cmd["size"]), cmd["path"], overwrite=True,
                           compression=cmd["compression"])
            finally:
                os._exit(0)
        if cmd["delay"] is not None:
            time.sleep(cmd["delay"])
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"killed": os.WIFSIGNALED(status)}), flush=True)
    """
)


class Server:
    """Drives the forking export server."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD": "1"},
        )

    def export(
        self,
        path: Path,
        tag: str,
        *,
        kill_at: str | None = None,
        delay: float | None = None,
        size: int = 1 << 16,
        compression: str = "auto",
    ) -> bool:
        assert self.proc.stdin and self.proc.stdout
        cmd = {
            "path": str(path),
            "tag": tag,
            "kill_at": kill_at,
            "delay": delay,
            "size": size,
            "compression": compression,
        }
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["killed"]

    def close(self) -> None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.close()
        self.proc.wait(30)
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """One forking export server per module."""
    srv = Server()
    yield srv
    srv.close()


def _steps(path: Path) -> list[str]:
    seen: list[str] = []
    _publish.STEP_HOOK = seen.append
    try:
        jio.export(
            {"tag": "probe", "arrays": [np.zeros(3) for _ in range(6)]}, path, overwrite=True
        )
    finally:
        _publish.STEP_HOOK = None
    return seen


def _check_survivor(path: Path, server: Server) -> None:
    tag = jio.load(path)["tag"]
    assert tag in ("old", "new")
    assert not server.export(path, "next")  # the next export is not blocked by debris
    assert jio.load(path)["tag"] == "next"
    debris = [p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}")]
    assert debris == [], debris


@pytest.mark.parametrize("suffix", ["", ".zip"], ids=["directory", "zip"])
def test_kill_at_every_step_boundary_keeps_a_checkpoint(
    suffix: str, tmp_path: Path, server: Server
) -> None:
    """kill -9 at each step boundary of an overwrite leaves the old or new checkpoint loadable."""
    steps = _steps(tmp_path / f"probe{suffix}")
    assert {"temp-synced", "written", "published", "done"} <= set(steps)
    for i, name in enumerate(steps):
        path = tmp_path / f"ck{i}{suffix}"
        assert not server.export(path, "old")
        assert server.export(path, "new", kill_at=name), f"child was not killed at {name!r}"
        _check_survivor(path, server)


@pytest.mark.parametrize("suffix", ["", ".zip"], ids=["directory", "zip"])
def test_kill_at_random_points_keeps_a_checkpoint(
    suffix: str, tmp_path: Path, server: Server
) -> None:
    """kill -9 at random moments of an export leaves the old or new checkpoint loadable."""
    rng = random.Random(int(os.environ.get("JAXSTRUCT_KILL_SEED", "0")))
    rounds = int(os.environ.get("JAXSTRUCT_KILL_ROUNDS", "6"))
    for i in range(rounds):
        path = tmp_path / f"ck{i}{suffix}"
        assert not server.export(path, "old", size=1 << 18)
        server.export(
            path, "new", delay=rng.uniform(0.0, 0.08), size=1 << 18, compression="deflate"
        )
        _check_survivor(path, server)


def test_overwrite_false_refuses_an_existing_path(tmp_path: Path) -> None:
    """Without overwrite, an existing target raises FileExistsError and is left alone."""
    path = jio.export([1], tmp_path / "c")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        jio.export([2], path)
    assert jio.load(path) == [1]


def test_overwrite_replaces_a_checkpoint(tmp_path: Path) -> None:
    """overwrite=True swaps in the new checkpoint and removes the old one."""
    for suffix in ("", ".zip"):
        path = jio.export([1], tmp_path / f"c{suffix}")
        jio.export([2], path, overwrite=True)
        assert jio.load(path) == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "c.zip"]


@pytest.mark.parametrize("make", ["dir-with-file", "empty-dir", "plain-file"])
def test_overwrite_refuses_what_is_not_a_checkpoint(make: str, tmp_path: Path) -> None:
    """overwrite=True never replaces a directory or file that is not a jaxstruct checkpoint."""
    path = tmp_path / ("target.zip" if make == "plain-file" else "target")
    if make == "plain-file":
        path.write_text("precious")
    else:
        path.mkdir()
        if make == "dir-with-file":
            (path / "notes.txt").write_text("precious")
    with pytest.raises(SerializationError, match="not a jaxstruct"):
        jio.export([1], path, overwrite=True)
    assert path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_overwrite_knows_its_own_manifest_and_rereads_an_edited_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest this process wrote is recognised without reading it again; once someone
    rewrites it (another identity), it is read, and a manifest that is not ours is refused."""
    from jaxstruct.io import _builtin

    path = jio.export({"w": np.ones(3)}, tmp_path / "ck")
    opened: list[Any] = []
    real = _builtin.open_regular

    def spy(*args: Any, **kwargs: Any) -> Any:
        opened.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(_builtin, "open_regular", spy)
    jio.export({"w": np.zeros(3)}, path, overwrite=True)
    assert opened == []  # its own manifest: known by identity
    monkeypatch.setattr(_builtin, "_WRITTEN", set())  # a new process: read to be sure
    jio.export({"w": np.ones(3)}, path, overwrite=True)
    assert opened == [path / "manifest.json"]
    (path / "manifest.json").write_text(json.dumps({"name": "my web bundle"}))
    with pytest.raises(SerializationError, match="not a jaxstruct"):
        jio.export({"w": np.zeros(3)}, path, overwrite=True)
    assert json.loads((path / "manifest.json").read_text()) == {"name": "my web bundle"}


def test_concurrent_writers_exactly_one_wins(tmp_path: Path) -> None:
    """Of two writers racing to create the same checkpoint, exactly one succeeds."""
    for round_ in range(8):
        path = tmp_path / (f"c{round_}" + (".zip" if round_ % 2 else ""))
        barrier = threading.Barrier(2)
        outcomes: list[Any] = []

        def write(
            tag: int,
            path: Path = path,
            barrier: threading.Barrier = barrier,
            outcomes: list[Any] = outcomes,
        ) -> None:
            barrier.wait()
            try:
                jio.export({"tag": tag, "w": np.ones(1000)}, path)
                outcomes.append(tag)
            except FileExistsError:
                outcomes.append("lost")

        threads = [threading.Thread(target=write, args=(t,)) for t in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if o != "lost"]
        assert len(winners) == 1, outcomes
        assert jio.load(path)["tag"] == winners[0]


def test_disk_full_mid_export_keeps_the_old_checkpoint(tmp_path: Path) -> None:
    """An OSError (ENOSPC) while writing leaves the old checkpoint and no temporary files."""
    for suffix in ("", ".zip"):
        path = jio.export({"v": "old"}, tmp_path / f"c{suffix}")

        def full(name: str) -> None:
            if name == "a1.npy":
                raise OSError(errno.ENOSPC, "No space left on device")

        _publish.STEP_HOOK = full
        try:
            with pytest.raises(jio.CheckpointWriteError, match=r"No space.*intact") as info:
                jio.export({"v": "new", "a": [np.ones(4), np.ones(4)]}, path, overwrite=True)
            assert info.value.errno == errno.ENOSPC
            assert isinstance(info.value, OSError) and isinstance(info.value, SerializationError)
            assert str(path) in str(info.value)
        finally:
            _publish.STEP_HOOK = None
        assert jio.load(path) == {"v": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "c.zip"]


def test_encoding_error_writes_nothing(tmp_path: Path) -> None:
    """A value that cannot be encoded fails before anything touches the disk."""
    path = jio.export({"v": "old"}, tmp_path / "c")
    with pytest.raises(SerializationError):
        jio.export({"v": object()}, path, overwrite=True)
    assert jio.load(path) == {"v": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_debris_of_dead_processes_is_cleaned(tmp_path: Path) -> None:
    """Temporaries left by a dead process are removed by the next export to the same target."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = tmp_path / f".c.jaxstruct-tmp-{_publish.host_tag()}-{dead.stdout.strip()}-abc"
    stale.mkdir()
    (stale / "manifest.json").write_text("{}")
    jio.export([1], tmp_path / "c")
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_debris_is_swept_at_the_first_overwrite_in_a_process_only(tmp_path: Path) -> None:
    """An overwrite sweeps a target's debris the first time in a process; later overwrites of
    the same target do not list the parent again, and a missing target is always swept."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = dead.stdout.strip()
    path = jio.export([0], tmp_path / "c")

    def plant(tag: str) -> Path:
        stale = tmp_path / f".c.jaxstruct-tmp-{_publish.host_tag()}-{pid}-{tag}"
        stale.mkdir()
        (stale / "manifest.json").write_text("{}")
        return stale

    plant("one")
    jio.export([1], path, overwrite=True)  # first overwrite of c here: swept
    assert [p.name for p in tmp_path.iterdir()] == ["c"]
    second = plant("two")
    jio.export([2], path, overwrite=True)  # not listed again
    assert second.exists()
    shutil.rmtree(path)
    jio.export([3], path)  # missing target: swept
    assert [p.name for p in tmp_path.iterdir()] == ["c"]
    assert jio.load(path) == [3]


@pytest.mark.parametrize(
    "kind", ["zip-with-manifest", "zip-with-foreign-manifest", "dir-with-foreign-manifest"]
)
def test_overwrite_refuses_a_look_alike(kind: str, tmp_path: Path) -> None:
    """overwrite=True replaces only a path whose manifest parses as a jaxstruct manifest: a
    user's zip holding a member named manifest.json (a web extension, say) or a directory
    whose manifest.json starts like ours but is not ours is left alone."""
    import zipfile

    if kind.startswith("zip"):
        path = tmp_path / "mine.zip"
        text = (
            '{"name": "my extension", "version": "1.0"}'
            if kind == "zip-with-manifest"
            else '{"format":"jaxstruct","note":"not really"}'
        )
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("manifest.json", text)
            archive.writestr("background.js", "console.log('precious')")
    else:
        path = tmp_path / "mine"
        path.mkdir()
        (path / "manifest.json").write_text('{"format":"jaxstruct","version":1}')
        (path / "arrays.npz").write_bytes(b"precious")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(SerializationError, match="not a jaxstruct"):
        jio.export({"w": np.ones(2)}, path, overwrite=True)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    if kind.startswith("zip"):
        with zipfile.ZipFile(path) as archive:
            assert archive.read("background.js") == b"console.log('precious')"


def test_overwrite_replaces_our_zip_and_directory(tmp_path: Path) -> None:
    """Checkpoints of the same format are still replaced (and a zip of a directory checkpoint,
    which the zip format reads, counts as one)."""
    for name in ("c.zip", "c"):
        path = jio.export({"v": 1}, tmp_path / name, compression="deflate")
        jio.export({"v": 2}, path, overwrite=True)
        assert jio.load(path) == {"v": 2}


def test_overwrite_refuses_a_symlink_to_a_zip_checkpoint(tmp_path: Path) -> None:
    """A link is the user's: overwrite=True leaves it and its target, as for directories."""
    real = jio.export({"w": 1}, tmp_path / "real.zip")
    link = tmp_path / "link.zip"
    link.symlink_to(real)
    with pytest.raises(SerializationError, match="not a jaxstruct zip checkpoint"):
        jio.export({"w": 2}, link, overwrite=True)
    assert link.is_symlink() and jio.load(link) == {"w": 1}


def test_parents_that_cannot_be_made_are_a_checkpoint_write_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(jio.CheckpointWriteError, match="writing the checkpoint failed") as info:
        jio.export({"w": 1}, tmp_path / "new" / "ck")
    assert info.value.errno == 13
