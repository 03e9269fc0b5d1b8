"""Racing writers and forks against ``format="orbax"``: one whole checkpoint, or our error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.registry import SerializationError

ENV = {k: v for k, v in os.environ.items() if k != "JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD"}
TIMEOUT_S = 120


def _run_script(script: str, root: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh Python (``sys.argv[1]`` is ``root``); it must exit 0."""
    proc = subprocess.run(
        [sys.executable, "-c", script, str(root)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _value(who: int) -> dict[str, Any]:
    """Two arrays and a tag, all saying ``who``: a mix of two exports shows."""
    return {
        "who": who,
        "w": np.full((64, 64), who, np.float32),
        "b": np.full(3000, who, np.int32),
    }


def _whole(path: Path) -> int:
    """Load ``path``; return whose value it holds, after checking every part says so."""
    got = jio.load(path)
    who = got["who"]
    assert np.all(np.asarray(got["w"]) == who) and np.all(np.asarray(got["b"]) == who), (
        f"{path} holds a mix of two exports"
    )
    return who


def _leftovers(path: Path) -> list[str]:
    """Everything beside ``path`` that was made for it (temporaries, parked checkpoints)."""
    return sorted(p.name for p in path.parent.iterdir() if path.name in p.name and p != path)


def _then_a_third_export_succeeds(path: Path) -> None:
    assert _leftovers(path) == []
    jio.export(_value(7), path, format="orbax", overwrite=True)
    assert _whole(path) == 7
    assert _leftovers(path) == []


# A process that exports on command at an agreed instant, so that two of them race.
RACER = textwrap.dedent(
    """
    import json, sys, tempfile, time
    import numpy as np
    import jaxstruct.io as jio

    def value(who):
        return {"who": who, "w": np.full((64, 64), who, np.float32),
                "b": np.full(3000, who, np.int32)}

    with tempfile.TemporaryDirectory() as scratch:  # orbax imported and warm before racing
        jio.export(value(0), scratch + "/warm", format="orbax")
        jio.load(scratch + "/warm")
    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        time.sleep(max(0.0, cmd["at"] - time.time()))
        outcome = "ok"
        for i in range(cmd["times"]):
            try:
                done = jio.export(value(cmd["who"] + 10 * (i % 2)), cmd["path"],
                                  format="orbax", overwrite=cmd["overwrite"],
                                  blocking=cmd["blocking"])
                if cmd["blocking"] is False:
                    done.wait(60)
            except Exception as err:
                outcome = f"{type(err).__module__}.{type(err).__name__}: {err}"
        print(json.dumps(outcome), flush=True)
    """
)


class Racers:
    """Two exporting processes, started once for the module."""

    def __init__(self) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", RACER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=ENV,
            )
            for _ in range(2)
        ]
        assert [self._answer(p) for p in self.procs] == ["ready", "ready"]

    def _answer(self, proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # each racer stops itself within TIMEOUT_S
        assert line, f"a racer died (exit status {proc.wait(TIMEOUT_S)})"
        return json.loads(line)

    def race(
        self,
        path: Path,
        *,
        overwrite: bool,
        times: int = 1,
        who: tuple[int, ...] = (1, 2),
        blocking: bool = True,
    ) -> list[str]:
        """Each racer exports ``times`` values to ``path`` from the same instant; return how
        each ended (``"ok"`` or its last error)."""
        at = time.time() + 0.2
        racing = self.procs[: len(who)]
        for proc, me in zip(racing, who, strict=True):
            assert proc.stdin is not None
            command = {"who": me, "path": str(path), "overwrite": overwrite, "at": at}
            command.update(times=times, blocking=blocking)
            proc.stdin.write(json.dumps(command) + "\n")
            proc.stdin.flush()
        return [self._answer(p) for p in racing]

    def close(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()
            proc.wait(TIMEOUT_S)
            proc.stdout.close()


@pytest.fixture(scope="module")
def racers() -> Iterator[Racers]:
    both = Racers()
    yield both
    both.close()


@pytest.mark.parametrize(("overwrite", "blocking"), [(False, True), (True, True), (False, False)])
def test_two_processes_racing_to_a_new_path(
    racers: Racers, overwrite: bool, blocking: bool, tmp_path: Path
) -> None:
    """Two processes export different values to a new path at once (blocking, or in the
    background, orbax's asynchronous save): with ``overwrite=True`` both succeed; without it
    one wins and the other gets ``FileExistsError`` naming the path. One whole checkpoint
    remains (never a mix), nothing beside it, and the next export works."""
    for round_ in range(2):
        path = tmp_path / f"ck{round_}"
        outcomes = racers.race(path, overwrite=overwrite, blocking=blocking)
        if overwrite:
            assert outcomes == ["ok", "ok"], outcomes
        else:
            assert sorted(outcomes)[1] == "ok", outcomes
            lost = sorted(outcomes)[0]
            assert lost.startswith("builtins.FileExistsError") and str(path) in lost, outcomes
        who = _whole(path)
        assert who in (1, 2)
        if not overwrite:
            assert outcomes[who - 1] == "ok"
        _then_a_third_export_succeeds(path)


def test_two_processes_racing_to_overwrite_a_checkpoint(racers: Racers, tmp_path: Path) -> None:
    """Two processes overwrite one checkpoint again and again at once: every export succeeds
    and the checkpoint left is one whole value of one of them."""
    path = jio.export(_value(0), tmp_path / "ck", format="orbax")
    outcomes = racers.race(path, overwrite=True, times=4)
    assert outcomes == ["ok", "ok"], outcomes
    assert _whole(path) in (1, 2, 11, 12)
    _then_a_third_export_succeeds(path)


@pytest.mark.parametrize(("overwrite", "existing"), [(False, False), (True, False), (True, True)])
def test_two_threads_racing_in_one_process(overwrite: bool, existing: bool, tmp_path: Path) -> None:
    """Two threads of one process export different values to one path at once (orbax allows
    one save at a time per process): the same outcomes as two processes."""
    for round_ in range(2):
        path = tmp_path / f"ck{round_}"
        if existing:
            jio.export(_value(0), path, format="orbax")
        barrier = threading.Barrier(2)
        outcomes: dict[int, BaseException | None] = {}

        def write(
            who: int,
            path: Path = path,
            barrier: threading.Barrier = barrier,
            outcomes: dict[int, BaseException | None] = outcomes,
        ) -> None:
            barrier.wait(TIMEOUT_S)
            try:
                jio.export(_value(who), path, format="orbax", overwrite=overwrite)
                outcomes[who] = None
            except BaseException as err:
                outcomes[who] = err

        threads = [threading.Thread(target=write, args=(who,)) for who in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S)
        errors = [e for e in outcomes.values() if e is not None]
        if overwrite:
            assert errors == []
        else:
            assert len(errors) == 1 and isinstance(errors[0], FileExistsError), errors
            assert str(path) in str(errors[0])
        who = _whole(path)
        assert outcomes[who] is None
        _then_a_third_export_succeeds(path)


# A restore orbax fails midway (its directory swapped away) leaves asyncio callbacks of
# its own on a closed event loop, which Python reports as unraisable. Not ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_loads_racing_overwrites_see_one_whole_checkpoint(racers: Racers, tmp_path: Path) -> None:
    """Loads while another process overwrites the checkpoint again and again: each returns
    the old or a new value whole, or our error, never a foreign exception or a mix."""
    path = jio.export(_value(0), tmp_path / "ck", format="orbax")
    outcome: list[str] = []
    writer = threading.Thread(
        target=lambda: outcome.extend(racers.race(path, overwrite=True, times=12, who=(1,)))
    )
    writer.start()
    seen: set[int] = set()
    refused = 0
    while writer.is_alive():
        try:
            seen.add(_whole(path))
        except SerializationError as err:
            assert "replaced" in str(err) and str(path) in str(err), err
            refused += 1
    writer.join(TIMEOUT_S)
    assert outcome == ["ok"]
    assert seen and seen <= {0, 1, 11}, seen
    assert _whole(path) == 11
    assert _leftovers(path) == []


# A parent that has exported and loaded with the orbax format (orbax's and
# tensorstore's threads, our pools, all running), then forks: once idle, once with a
# background orbax export in flight. The parent waits for each child at most 60 s.
FORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    import numpy as np
    import jaxstruct.io as jio
    from jaxstruct.registry import SerializationError

    root = sys.argv[1]

    def value(tag):
        return {"tag": tag, "w": np.full((64, 64), len(tag), np.float32)}

    def check(path, tag):
        got = jio.load(path)
        assert got["tag"] == tag and np.all(got["w"] == len(tag)), (path, got)

    def child(tag):
        # tensorstore aborts a forked child that uses it: our error comes first
        for attempt in (lambda: jio.export(value(tag), f"{root}/{tag}", format="orbax"),
                        lambda: jio.load(f"{root}/warm")):
            try:
                attempt()
                return 4
            except SerializationError as err:
                assert "forked" in str(err) and "spawn" in str(err), err
        jio.export(value(tag), f"{root}/{tag}.zip")  # the other formats work
        check(f"{root}/{tag}.zip", tag)
        jio.export(value(tag), f"{root}/{tag}.zip", overwrite=True, compression="deflate")
        check(f"{root}/{tag}.zip", tag)
        return 0

    def fork(tag):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = child(tag)
            finally:
                os._exit(code)
        return pid

    def reap(pid):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return 3

    jio.export(value("warm"), f"{root}/warm", format="orbax")
    check(f"{root}/warm", "warm")
    jio.export(value("warm"), f"{root}/warm.zip", compression="deflate")
    check(f"{root}/warm.zip", "warm")

    first = fork("idle")
    jio.export(value("after"), f"{root}/after", format="orbax")  # the parent goes on
    check(f"{root}/after", "after")
    assert reap(first) == 0, f"the child forked idle ended with {reap(first)}"

    handle = jio.export(value("background"), f"{root}/bg", format="orbax", blocking=False)
    second = fork("during")
    handle.wait(60)
    check(f"{root}/bg", "background")
    jio.export(value("later"), f"{root}/bg", format="orbax", overwrite=True)
    check(f"{root}/bg", "later")
    code = reap(second)
    assert code == 0, f"the child forked during a background export ended with {code}"
    print(sorted(os.listdir(root)))
    """
)


def test_forked_children_get_our_error_for_orbax_and_use_the_other_formats(
    tmp_path: Path,
) -> None:
    """Children forked after orbax ran (idle, and with a background orbax export in flight)
    get our error naming the fix for orbax instead of tensorstore's abort, export and load
    ``.zip`` checkpoints and exit 0 within the timeout; the parent's own exports complete."""
    proc = _run_script(FORKER, tmp_path)
    # JAX saw the fork with its threads running (the situation this test is about).
    assert "os.fork() was called" in proc.stderr
    assert "aborting" not in proc.stderr
    listed = ["after", "bg", "during.zip", "idle.zip", "warm", "warm.zip"]
    assert json.loads(proc.stdout.strip().replace("'", '"')) == listed


# A fresh process, jax not yet imported: a child forked before orbax ever ran may use
# it; then two threads export at once while the first of them imports jax.
FRESH = textwrap.dedent(
    """
    import multiprocessing, sys, threading
    import numpy as np
    import jaxstruct.io as jio

    root = sys.argv[1]
    assert "jax" not in sys.modules

    def in_child(path):
        jio.export({"w": np.arange(5)}, path, format="orbax")
        return jio.load(path)["w"].tolist()

    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(in_child, (f"{root}/child",)).get(60)
    assert got == [0, 1, 2, 3, 4], got

    errors = []
    barrier = threading.Barrier(2)
    def write(who):
        barrier.wait(60)
        try:
            jio.export({"w": np.full(8, who)}, f"{root}/t{who}", format="orbax")
        except BaseException as err:
            errors.append(f"{type(err).__name__}: {err}")
    threads = [threading.Thread(target=write, args=(who,)) for who in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [], errors
    assert [jio.load(f"{root}/t{who}")["w"][0] for who in (1, 2)] == [1, 2]
    """
)


def test_fresh_process_forks_before_orbax_ran_and_imports_jax_under_two_exports(
    tmp_path: Path,
) -> None:
    """A child forked (multiprocessing's fork start method) before the parent ran orbax uses
    it; two threads exporting at once while one of them imports jax both succeed."""
    _run_script(FRESH, tmp_path)


# A parent forks one child per (step, path) that exports with format="orbax" and is
# killed (-9) at that step; then the parent, which never ran orbax itself before,
# exports to the same path and lists what is beside it. (Forked before orbax runs in the
# parent: tensorstore refuses children of a process where it ran.)
KILLED = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    import jaxstruct.io as jio
    from jaxstruct.io import _publish
    import jax, orbax.checkpoint  # imported and started (not run) here, once for every child
    jax.devices()

    root = sys.argv[1]
    cases = [(step, existing) for step in ("temp-synced", "published")
             for existing in (False, True)]
    for n, (step, existing) in enumerate(cases):
        path = f"{root}/ck{n}"
        if existing:  # written by a child too: orbax never runs in the parent before
            pid = os.fork()
            if pid == 0:
                try:
                    jio.export({"tag": "old", "w": np.ones(3)}, path, format="orbax")
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
        pid = os.fork()
        if pid == 0:
            def hook(name, step=step):
                if name == step:
                    os.kill(os.getpid(), signal.SIGKILL)
            _publish.STEP_HOOK = hook
            try:
                jio.export({"tag": "new", "w": np.full(1 << 12, 2.0)}, path, format="orbax",
                           overwrite=existing)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status), (step, existing, status)
    report = []
    for n, (step, existing) in enumerate(cases):
        path = f"{root}/ck{n}"
        before = jio.load(path)["tag"] if os.path.exists(path) else None
        jio.export({"tag": "next", "w": np.zeros(3)}, path, format="orbax", overwrite=True)
        assert jio.load(path)["tag"] == "next"
        beside = sorted(p for p in os.listdir(root) if p.startswith((f"ck{n}", f".ck{n}")))
        report.append([step, existing, before, beside])
    print(json.dumps(report))
    """
)


def test_a_killed_orbax_export_leaves_nothing_the_next_one_keeps(tmp_path: Path) -> None:
    """kill -9 of an orbax export at each step, to a new path and over a checkpoint: the
    path holds the old or the new checkpoint (or nothing, when new), and the next export
    there succeeds and removes everything the killed one left beside it."""
    proc = _run_script(KILLED, tmp_path)
    for n, (step, existing, before, beside) in enumerate(json.loads(proc.stdout)):
        assert before in (("old", "new") if existing else (None, "new")), (step, before)
        assert beside == [f"ck{n}"], (step, existing, beside)


def test_an_overwrite_swapping_the_checkpoint_while_it_is_opened_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever error reading a swapped checkpoint's items meets (a file gone, a size that
    changed), the load says the checkpoint was replaced while read, and to load it again."""
    from jaxstruct.orbax import _format

    path = tmp_path / "ck"
    jio.export(_value(1), path, format="orbax")
    read_storage = _format.read_storage

    def swapped_midway(p: Any, limits: Any, where: str) -> Any:
        monkeypatch.setattr(_format, "read_storage", read_storage)
        jio.export(_value(2), path, format="orbax", overwrite=True)
        raise SerializationError(f"{where}: the jaxstruct storage item is missing")

    monkeypatch.setattr(_format, "read_storage", swapped_midway)
    with pytest.raises(SerializationError, match=r"replaced .* while it was being read"):
        jio.load(path)
    assert _whole(path) == 2
