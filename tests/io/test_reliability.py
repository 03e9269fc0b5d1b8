"""Reliability findings: parked checkpoints, racing overwrites, deep trees, huge manifests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io import _publish
from jaxstruct.io._cli import main as cli_main
from jaxstruct.registry import SerializationError

ENV = {**os.environ, "JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD": "1"}

# Exports with RENAME_EXCHANGE unavailable (renameat2 answering EINVAL, as on
# filesystems without it) and kills itself between the two fallback renames.
KILLED_BETWEEN_RENAMES = textwrap.dedent(
    """
    import errno, os, signal, sys
    import jaxstruct.io as jio
    from jaxstruct.io import _publish

    real = _publish._renameat2

    def no_exchange(src, dst, flags):
        if flags == _publish._RENAME_EXCHANGE:
            return False  # what _renameat2 answers when the kernel says EINVAL
        return real(src, dst, flags)

    _publish._renameat2 = no_exchange

    def hook(name):
        if name == "parked":
            os.kill(os.getpid(), signal.SIGKILL)

    _publish.STEP_HOOK = hook
    jio.export({"tag": "new"}, sys.argv[1], overwrite=True)
    """
)


def test_parked_checkpoint_is_recovered_after_kill_between_renames(tmp_path: Path) -> None:
    """Without RENAME_EXCHANGE, kill -9 between the renames loses nothing: it is recovered."""
    path = jio.export({"tag": "old"}, tmp_path / "ck")
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_BETWEEN_RENAMES, str(path)], env=ENV, check=False, timeout=120
    )
    assert proc.returncode == -9
    assert not path.exists()  # the window the fallback has: the old one is parked
    parked = [p.name for p in tmp_path.iterdir() if ".jaxstruct-old-" in p.name]
    assert len(parked) == 1
    # The next export first moves the parked checkpoint back, so without
    # overwrite it finds the target taken, and the old checkpoint loads.
    with pytest.raises(FileExistsError):
        jio.export({"tag": "next"}, path)
    assert jio.load(path) == {"tag": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


# A worker exports on command at an agreed instant, so two processes race.
RACER = textwrap.dedent(
    """
    import json, sys, tempfile, time
    import numpy as np
    import jaxstruct.io as jio

    with tempfile.TemporaryDirectory() as scratch:  # the first export's imports, before racing
        jio.export({"w": np.zeros(2)}, scratch + "/warm")
    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        value = {"who": cmd["who"], "w": np.full(50_000, cmd["who"], np.float32)}
        time.sleep(max(0.0, cmd["at"] - time.time()))
        try:
            jio.export(value, cmd["path"], overwrite=True)
            print(json.dumps("ok"), flush=True)
        except Exception as err:
            print(json.dumps(f"{type(err).__name__}: {err}"), flush=True)
    """
)


@pytest.mark.parametrize("suffix", ["", ".zip"], ids=["directory", "zip"])
def test_racing_overwrites_to_a_new_path_both_succeed(suffix: str, tmp_path: Path) -> None:
    """Two processes overwriting a missing path both succeed; one whole checkpoint remains."""
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for _ in range(2)
    ]
    try:
        assert [json.loads(p.stdout.readline()) for p in racers if p.stdout] == ["ready"] * 2
        for round_ in range(10):
            path = tmp_path / f"ck{round_}{suffix}"
            at = time.time() + 0.3
            for who, proc in enumerate(racers):
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"who": who, "path": str(path), "at": at}) + "\n")
                proc.stdin.flush()
            outcomes = [json.loads(p.stdout.readline()) for p in racers if p.stdout]
            assert outcomes == ["ok", "ok"], (round_, outcomes)
            value = jio.load(path)
            assert value["who"] in (0, 1)
            assert (value["w"] == value["who"]).all()
    finally:
        for proc in racers:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(60)
            if proc.stdout:
                proc.stdout.close()


def _peak_of_to_state_dict(depth: int) -> int:
    value = None
    for _ in range(depth):
        value = [value]
    tracemalloc.start()
    try:
        jio.to_state_dict(value)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_encoding_memory_is_linear_in_depth() -> None:
    """to_state_dict of a tree 4x deeper needs about 4x the memory, not 16x (lazy paths)."""
    small = _peak_of_to_state_dict(2_000)
    large = _peak_of_to_state_dict(8_000)
    assert large < 6 * small, (small, large)


def test_error_paths_are_still_named() -> None:
    """A value that cannot be exported deep in a tree is still named by its full path."""
    with pytest.raises(SerializationError, match=r"root\[0\]\.<key 'k'>|root\[0\]\['k'\]\[1\]"):
        jio.to_state_dict([{"k": [1, object()]}])


def _empty_nodes_manifest(path: Path, nodes: int) -> Path:
    jio.export({"a": 1}, path)
    head = (
        '{"format":"jaxstruct","version":1,"container":"directory",\n"arrays":{},\n'
        f'"manifest":{{"root":{nodes - 1},"nodes":[\n'
    )
    (path / "manifest.json").write_text(head + ",".join(["[]"] * nodes) + "]}}\n")
    return path


def test_max_nodes_refuses_before_parsing_in_load(tmp_path: Path) -> None:
    """A manifest of many empty nodes is refused by max_nodes before it is parsed."""
    path = _empty_nodes_manifest(tmp_path / "ck", 2_000_000)
    tracemalloc.start()
    try:
        with pytest.raises(SerializationError, match="max_nodes=1000"):
            jio.load(path, max_nodes=1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Parsing its 6 MB would take over 100 MB; the pre-count works a slice at a time.
    assert peak < 40 << 20, peak


def test_max_nodes_refuses_in_inspect_and_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """inspect and the CLI refuse it with the max_nodes message, never an IndexError."""
    path = _empty_nodes_manifest(tmp_path / "ck", 300_000)
    with pytest.raises(SerializationError, match="max_nodes=1000"):
        jio.inspect(path, max_nodes=1000)
    assert cli_main(["inspect", str(path), "--max-nodes", "1000"]) == 2
    err = capsys.readouterr().err
    assert "max_nodes=1000" in err and "IndexError" not in err


def test_strings_with_brackets_do_not_count_as_nodes(tmp_path: Path) -> None:
    """Brackets and commas inside strings are not mistaken for nodes by the pre-count."""
    value = ["[,],{,}" * 50, '\\"[,' * 50]
    path = jio.export(value, tmp_path / "ck")
    assert jio.load(path, max_nodes=3) == value
    np.testing.assert_equal(jio.load(path, max_nodes=3), value)


# Exports with RENAME_EXCHANGE unavailable and stops (SIGSTOP) between the two
# fallback renames, so the test can look at the disk in that window.
STOPPED_BETWEEN_RENAMES = KILLED_BETWEEN_RENAMES.replace("signal.SIGKILL", "signal.SIGSTOP")


def test_load_reads_the_parked_checkpoint_between_the_renames(tmp_path: Path) -> None:
    """Without RENAME_EXCHANGE, a load between the two renames (or after a kill there) reads
    the parked old checkpoint instead of raising FileNotFoundError."""
    path = jio.export({"tag": "old"}, tmp_path / "ck")
    writer = subprocess.Popen([sys.executable, "-c", STOPPED_BETWEEN_RENAMES, str(path)], env=ENV)
    try:
        deadline = time.monotonic() + 120
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not path.exists()  # parked: only the old checkpoint's parked name exists
        assert jio.load(path) == {"tag": "old"}
        assert jio.load(str(path)) == {"tag": "old"}
    finally:
        os.kill(writer.pid, signal.SIGCONT)
        assert writer.wait(120) == 0
    assert jio.load(path) == {"tag": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_load_reads_the_parked_checkpoint_after_a_kill(tmp_path: Path) -> None:
    """After kill -9 between the renames, load reads the old checkpoint before any export."""
    path = jio.export({"tag": "old"}, tmp_path / "ck")
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_BETWEEN_RENAMES, str(path)], env=ENV, check=False, timeout=120
    )
    assert proc.returncode == -9 and not path.exists()
    assert jio.load(path) == {"tag": "old"}
    with pytest.raises(FileNotFoundError):
        jio.load(tmp_path / "other")


def test_inspect_reads_the_parked_checkpoint_as_load_does(tmp_path: Path) -> None:
    """After kill -9 between the renames, inspect describes the parked checkpoint (load reads
    it), instead of raising FileNotFoundError."""
    path = jio.export({"tag": "old"}, tmp_path / "ck")
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_BETWEEN_RENAMES, str(path)], env=ENV, check=False, timeout=120
    )
    assert proc.returncode == -9 and not path.exists()
    info = jio.inspect(path)
    assert info.container == "directory" and "'old'" in info.tree


# Exports over an existing checkpoint, then leaves with os._exit as multiprocessing
# workers do: nothing may be left to a thread that os._exit cuts short.
EXIT_AFTER_OVERWRITE = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import jaxstruct.io as jio

    path, blocking = sys.argv[1], sys.argv[2] == "blocking"
    new = {"tag": "new", "w": np.zeros(3)}
    if blocking:
        jio.export(new, path, overwrite=True)
    else:
        jio.export(new, path, overwrite=True, blocking=False).wait()
    os._exit(0)
    """
)


@pytest.mark.parametrize("mode", ["blocking", "non-blocking"])
def test_overwrite_then_os_exit_leaves_no_old_checkpoint(mode: str, tmp_path: Path) -> None:
    """export(overwrite=True) (or its handle's wait) returns only once the replaced checkpoint
    is gone, so a process ending with os._exit right after leaves nothing hidden."""
    for i in range(3):
        path = jio.export(
            {"tag": "old", "w": np.ones(8 << 20, np.float32)},
            tmp_path / f"ck{i}",
            compression="none",
        )
        proc = subprocess.run(
            [sys.executable, "-c", EXIT_AFTER_OVERWRITE, str(path), mode],
            env=ENV,
            check=False,
            timeout=120,
        )
        assert proc.returncode == 0
        assert jio.load(path)["tag"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck0", "ck1", "ck2"]


def _plant(target: Path, name: str, age_s: float = 0.0) -> Path:
    stale = target.with_name(name)
    stale.mkdir()
    (stale / "arrays.npz").write_bytes(b"half written")
    if age_s:
        then = time.time() - age_s
        for p in (stale / "arrays.npz", stale):
            os.utime(p, (then, then))
    return stale


def test_young_temporary_of_another_host_is_not_swept(tmp_path: Path) -> None:
    """A temporary named by another host (or container) is left alone while it is young, even
    when its pid means no live process here; once unchanged for FOREIGN_AGE_S it is swept.
    This host's temporaries of dead processes go at once."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    target = tmp_path / "ck"
    other = "h0123456789" if _publish.host_tag() != "h0123456789" else "h9876543210"
    young = _plant(target, f".ck.jaxstruct-tmp-{other}-{dead}-aaaa")
    legacy = _plant(target, f".ck.jaxstruct-tmp-{dead}-bbbb")  # an older jaxstruct's name
    old = _plant(target, f".ck.jaxstruct-tmp-{other}-{dead}-cccc", _publish.FOREIGN_AGE_S + 60)
    mine = _plant(target, f".ck.jaxstruct-tmp-{_publish.host_tag()}-{dead}-dddd")
    jio.export([1], target)
    assert young.exists() and legacy.exists()
    assert (young / "arrays.npz").read_bytes() == b"half written"
    assert not old.exists() and not mine.exists()
    assert jio.load(target) == [1]


def test_parked_checkpoint_of_another_host_is_read_not_moved(tmp_path: Path) -> None:
    """A young parked checkpoint of another host is not moved back by an export (its writer
    may be between its renames), but a load of the missing target reads it."""
    target = tmp_path / "ck"
    jio.export({"tag": "old"}, tmp_path / "src")
    other = "h0123456789" if _publish.host_tag() != "h0123456789" else "h9876543210"
    parked = tmp_path / f".ck.jaxstruct-old-{other}-1-aaaa"
    os.rename(tmp_path / "src", parked)
    assert jio.load(target) == {"tag": "old"}
    jio.export({"tag": "new"}, target)
    assert parked.exists() and jio.load(target) == {"tag": "new"}


def test_a_load_racing_an_overwrite_retries_instead_of_calling_it_foreign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory swapped by an overwrite while load looks at it (between the formats'
    recognisers) is opened again, not reported as "not a checkpoint"."""
    from jaxstruct.io._builtin import DirectoryFormat

    target, newer = tmp_path / "ck", tmp_path / "newer"
    jio.export({"v": "old"}, target)
    jio.export({"v": "new"}, newer)
    sniff = DirectoryFormat.sniff
    calls = []

    def racing_sniff(self: DirectoryFormat, path: Path) -> bool:
        if not calls:  # the first look: an overwrite swaps the directory meanwhile
            os.rename(target, tmp_path / "gone")
            os.rename(newer, target)
            calls.append(path)
            return False
        return sniff(self, path)

    monkeypatch.setattr(DirectoryFormat, "sniff", racing_sniff)
    assert jio.load(target) == {"v": "new"}
    assert calls


def _two_renames(monkeypatch: pytest.MonkeyPatch) -> None:
    """Swap directories with two renames, as where RENAME_EXCHANGE is missing."""
    real = _publish._renameat2

    def no_exchange(src: Path, dst: Path, flags: int) -> bool:
        return False if flags == _publish._RENAME_EXCHANGE else real(src, dst, flags)

    monkeypatch.setattr(_publish, "_renameat2", no_exchange)


def test_an_interrupt_between_the_two_renames_puts_the_old_checkpoint_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _two_renames(monkeypatch)
    path = jio.export({"tag": "old"}, tmp_path / "ck")

    def hook(name: str) -> None:
        if name == "parked":
            raise KeyboardInterrupt

    monkeypatch.setattr(_publish, "STEP_HOOK", hook)
    with pytest.raises(KeyboardInterrupt):
        jio.export({"tag": "new"}, path, overwrite=True)
    assert jio.load(path) == {"tag": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_a_writer_publishing_between_the_two_renames_is_replaced_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer's checkpoint landing at the target between our renames: ours is
    swapped in after it (overwrite=True), and nothing is left beside the target."""
    _two_renames(monkeypatch)
    path = jio.export({"tag": "old"}, tmp_path / "ck")
    other = jio.export({"tag": "other"}, tmp_path / "other")

    def hook(name: str) -> None:
        if name == "parked" and other.exists():
            os.rename(other, path)  # the other writer's publication

    monkeypatch.setattr(_publish, "STEP_HOOK", hook)
    jio.export({"tag": "ours"}, path, overwrite=True)
    assert jio.load(path) == {"tag": "ours"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


@pytest.mark.parametrize("name", ["ck", "ck.zip"])
def test_an_unreadable_checkpoint_is_named_as_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A checkpoint this user may not read says so, not "not a checkpoint"."""
    path = jio.export({"w": 1}, tmp_path / name)
    path.chmod(0)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == path else real(p, mode))
    try:
        if os.geteuid() == 0:  # root reads anything: make the formats fail as for a user
            from jaxstruct.io._builtin import DirectoryFormat, ZipFormat

            monkeypatch.setattr(DirectoryFormat, "sniff", lambda self, p: False)
            monkeypatch.setattr(ZipFormat, "sniff", lambda self, p: False)
        with pytest.raises(SerializationError, match=r"cannot be read \(permission denied\)"):
            jio.load(path)
    finally:
        path.chmod(0o755 if path.is_dir() else 0o644)


def test_an_overwrite_racing_another_swap_is_not_refused_as_foreign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target swapped by another writer while overwrite=True checks it is ours: it is
    checked again, not refused as "not a jaxstruct checkpoint"."""
    from jaxstruct.io._builtin import DirectoryFormat

    target, other = tmp_path / "ck", tmp_path / "other"
    jio.export({"v": "old"}, target)
    jio.export({"v": "other"}, other)
    owns = DirectoryFormat.owns
    calls = []

    def racing_owns(self: DirectoryFormat, path: Path) -> bool:
        if not calls:  # the other writer's swap lands while we look
            os.rename(target, tmp_path / "gone")
            os.rename(other, target)
            calls.append(path)
            return False
        return owns(self, path)

    monkeypatch.setattr(DirectoryFormat, "owns", racing_owns)
    jio.export({"v": "ours"}, target, overwrite=True)
    assert jio.load(target) == {"v": "ours"} and calls
    # A path that is not a checkpoint is still refused, after a second look.
    (tmp_path / "mine").mkdir()
    with pytest.raises(SerializationError, match="not a jaxstruct directory checkpoint"):
        jio.export({"v": 1}, tmp_path / "mine", overwrite=True)
