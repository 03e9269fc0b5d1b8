"""Repeated small overwrites write into the old checkpoint's files (jaxstruct.io._spare).

Only the second and later overwrites of a target keep the swapped-out
checkpoint, as a hidden spare carrying the process id; it is reused only when
nothing else can see the change, and removed at exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io import _atomic, _builtin, _spare
from jaxstruct.registry import SerializationError

pytestmark = pytest.mark.skipif(not _spare.enabled(), reason="spares need Linux write leases")


def _value(tag: int) -> dict[str, object]:
    return {"tag": f"v{tag}", "a": np.full(5, tag, dtype=np.int32)}


def _check(path: Path, tag: int) -> None:
    got = jio.load(path)
    assert got["tag"] == f"v{tag}"
    assert got["a"].tolist() == [tag] * 5


def _ino(path: Path) -> int:
    return os.stat(path / "arrays.npz").st_ino


def _spares(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_repeated_overwrites_reuse_the_old_files(tmp_path: Path) -> None:
    path = tmp_path / "c"
    jio.export(_value(1), path)
    jio.export(_value(2), path, overwrite=True)
    assert _spares(tmp_path) == []  # one overwrite leaves nothing behind
    second = _ino(path)
    jio.export(_value(3), path, overwrite=True)
    spares = _spares(tmp_path)
    assert len(spares) == 1 and f"-{os.getpid()}-" in spares[0]
    assert os.stat(tmp_path / spares[0] / "arrays.npz").st_ino == second
    _check(path, 3)
    before = os.stat(path).st_mtime_ns
    time.sleep(0.05)  # past the clock tick of file timestamps
    jio.export(_value(4), path, overwrite=True)
    assert _ino(path) == second  # export 2's files, rewritten in place
    assert os.stat(path).st_mtime_ns > before  # watchers of the directory see a change
    _check(path, 4)
    jio.export({"a": np.arange(3000.0)}, path, overwrite=True)  # another size: same files
    assert _ino(path) != second and jio.load(path)["a"].tolist() == list(range(3000))
    _atomic.drain()
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_the_spare_is_removed_when_the_process_exits(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import numpy as np, jaxstruct.io as jio
        for i in range(4):
            jio.export({{"a": np.full(3, i)}}, {str(tmp_path / "c")!r}, overwrite=True)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert [p.name for p in tmp_path.iterdir()] == ["c"]
    assert jio.load(tmp_path / "c")["a"].tolist() == [3, 3, 3]


def test_a_file_held_open_is_never_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "c"
    for tag in (1, 2):
        jio.export(_value(tag), path, overwrite=True)
    fd = os.open(path / "arrays.npz", os.O_RDONLY)  # a reader of export 2, slow to read
    try:
        before = os.pread(fd, 1 << 16, 0)
        jio.export(_value(3), path, overwrite=True)  # export 2 becomes the spare...
        jio.export(_value(4), path, overwrite=True)  # ...but is open: not reused
        assert os.pread(fd, 1 << 16, 0) == before
        assert os.fstat(fd).st_ino != _ino(path)
        _check(path, 4)
    finally:
        os.close(fd)
    _atomic.drain()


def test_a_hard_linked_file_is_never_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "c"
    for tag in (1, 2):
        jio.export(_value(tag), path, overwrite=True)
    os.link(path / "arrays.npz", tmp_path / "backup.npz")  # e.g. cp -al snapshots
    for tag in (3, 4, 5):
        jio.export(_value(tag), path, overwrite=True)
        _check(path, tag)
    with np.load(tmp_path / "backup.npz", allow_pickle=False) as backup:
        assert [backup[k].tolist() for k in backup.files] == [[2] * 5]
    _atomic.drain()


def test_a_spare_with_other_entries_is_not_reused(tmp_path: Path) -> None:
    path = tmp_path / "c"
    for tag in (1, 2):
        jio.export(_value(tag), path, overwrite=True)
    (path / "notes.txt").write_text("mine")
    for tag in (3, 4):
        jio.export(_value(tag), path, overwrite=True)
        assert sorted(p.name for p in path.iterdir()) == ["arrays.npz", "manifest.json"]
        _check(path, tag)
    _atomic.drain()
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_an_export_to_a_removed_target_uses_the_spare(tmp_path: Path) -> None:
    path = tmp_path / "c"
    for tag in (1, 2, 3):
        jio.export(_value(tag), path, overwrite=True)
    [spare] = _spares(tmp_path)
    ino = os.stat(tmp_path / spare / "arrays.npz").st_ino
    for p in path.iterdir():
        p.unlink()
    path.rmdir()
    jio.export(_value(4), path)  # no overwrite needed: the target is gone
    assert _ino(path) == ino
    _check(path, 4)
    assert _spares(tmp_path) == []


def test_a_load_reads_one_export_even_if_overwritten_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both files are opened before either is read: never this manifest with those arrays.

    The first overwrite deletes the old files at once, so the load opens the
    new checkpoint again from the path; the third keeps them as the spare.
    """
    path = jio.export({"tag": "old", "a": np.ones(4)}, tmp_path / "c")
    jio.export({"tag": "old", "a": np.ones(4)}, path, overwrite=True)
    real = _builtin.open_regular
    calls: list[str] = []

    def open_then_overwrite(p: Path, **kwargs: object) -> tuple[int, int]:
        out = real(p, **kwargs)  # pyright: ignore[reportArgumentType]
        calls.append(p.name)
        if p.name == "manifest.json" and len(calls) == 1:
            jio.export({"tag": "new", "a": np.zeros(4)}, path, overwrite=True)
        return out

    monkeypatch.setattr(_builtin, "open_regular", open_then_overwrite)
    got = jio.load(path)  # the old directory is kept as the spare: read whole from it
    assert calls == ["manifest.json", "arrays.npz"]
    assert got["tag"] == "old" and got["a"].tolist() == [1, 1, 1, 1]
    monkeypatch.undo()
    assert jio.load(path)["tag"] == "new"
    _atomic.drain()


def test_a_load_opens_again_a_checkpoint_deleted_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = jio.export({"tag": "old", "a": np.ones(4)}, tmp_path / "c")
    real = _builtin.open_regular
    calls: list[str] = []

    def open_then_overwrite(p: Path, **kwargs: object) -> tuple[int, int]:
        out = real(p, **kwargs)  # pyright: ignore[reportArgumentType]
        calls.append(p.name)
        if len(calls) == 1:  # the first overwrite deletes the old files at once
            jio.export({"tag": "new", "a": np.zeros(4)}, path, overwrite=True)
        return out

    monkeypatch.setattr(_builtin, "open_regular", open_then_overwrite)
    got = jio.load(path)
    assert calls == [
        "manifest.json",
        "manifest.json",
        "arrays.npz",
    ]  # the first arrays.npz was gone
    assert got["tag"] == "new" and got["a"].tolist() == [0, 0, 0, 0]


_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import jaxstruct.io as jio
    from jaxstruct.io import _atomic
    path, kill_at = sys.argv[1], sys.argv[2]
    for i in (1, 2, 3):
        jio.export({"tag": f"v{i}", "a": np.full(5, i, dtype=np.int32)}, path, overwrite=True)
    def hook(name):
        if name == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    _atomic.STEP_HOOK = hook
    jio.export({"tag": "v4", "a": np.full(5, 4, dtype=np.int32)}, path, overwrite=True)
    """
)


@pytest.mark.parametrize(
    "kill_at", ["arrays-written", "manifest-written", "temp-synced", "written", "published"]
)
def test_kill_during_a_rewrite_leaves_the_old_or_the_new(tmp_path: Path, kill_at: str) -> None:
    path = tmp_path / "c"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLER, str(path), kill_at],
        check=False,
        timeout=120,
        capture_output=True,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert len(_spares(tmp_path)) == 1  # the spare being rewritten, or the one swapped out
    expected = 4 if kill_at == "published" else 3
    _check(path, expected)
    jio.export(_value(5), path, overwrite=True)  # the dead process's spare is swept
    _check(path, 5)
    _atomic.drain()
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_the_fallback_swap_keeps_no_spare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without RENAME_EXCHANGE the old checkpoint goes through a *parked* name, which a
    later export could take for a checkpoint to recover: it is never kept."""
    real = _atomic._renameat2

    def no_exchange(src: Path, dst: Path, flags: int) -> bool:
        return False if flags == _atomic._RENAME_EXCHANGE else real(src, dst, flags)

    monkeypatch.setattr(_atomic, "_renameat2", no_exchange)
    path = tmp_path / "c"
    for tag in (1, 2, 3, 4):
        jio.export(_value(tag), path, overwrite=True)
        _check(path, tag)
        assert _spares(tmp_path) == []


def test_an_unreadable_checkpoint_directory_is_a_clear_error(tmp_path: Path) -> None:
    path = jio.export(_value(1), tmp_path / "c")
    with pytest.raises(SerializationError, match="cannot be opened"):
        _builtin.DirectoryFormat().open(path / "manifest.json", jio.Limits())
