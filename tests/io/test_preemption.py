"""CheckpointManager(save_on_preemption=True) in one process: SIGTERM, last save, handler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io import _multihost

TIMEOUT = 120


@pytest.fixture
def own_handler() -> Any:
    """A Python SIGTERM handler of the test's own, put back afterwards."""
    calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    yield calls
    signal.signal(signal.SIGTERM, previous)


def test_no_handler_unless_asked(tmp_path: Path, own_handler: list[int]) -> None:
    before = signal.getsignal(signal.SIGTERM)
    manager = jio.CheckpointManager(tmp_path)
    assert signal.getsignal(signal.SIGTERM) is before
    assert not manager.reached_preemption(1) and not manager.preempted
    manager.close()


def test_sigterm_makes_the_next_save_the_last_one(tmp_path: Path, own_handler: list[int]) -> None:
    """The notice is recorded and passed on; the next save commits before returning."""
    before = signal.getsignal(signal.SIGTERM)
    with jio.CheckpointManager(tmp_path, save_on_preemption=True) as manager:
        assert signal.getsignal(signal.SIGTERM) is not before
        manager.save(1, {"w": np.zeros(2)})
        assert not manager.reached_preemption(2)
        signal.raise_signal(signal.SIGTERM)
        assert own_handler == [signal.SIGTERM]  # chained to the handler it replaced
        assert manager.reached_preemption(3) and manager.reached_preemption(4)
        manager.save(3, {"w": np.full(2, 3.0)})
        # Committed when save() returns, although the manager saves in the background.
        assert manager._thread is None and manager.all_steps() == [1, 3]
        assert manager.preempted
    assert signal.getsignal(signal.SIGTERM) is before
    np.testing.assert_array_equal(jio.load(tmp_path / "3")["w"], [3.0, 3.0])


def test_a_save_after_the_notice_waits_without_asking(
    tmp_path: Path, own_handler: list[int]
) -> None:
    """A loop that only saves (never asks reached_preemption) still gets a committed save."""
    manager = jio.CheckpointManager(tmp_path, save_on_preemption=True)
    signal.raise_signal(signal.SIGTERM)
    manager.save(7, {"w": np.ones(1)})
    assert manager._thread is None and manager.preempted and manager.all_steps() == [7]
    manager.close()


def test_a_forked_child_does_not_see_the_notice(
    tmp_path: Path, own_handler: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a child the handler acts as the replaced one: the notice is the parent's only."""
    manager = jio.CheckpointManager(tmp_path, save_on_preemption=True)
    watch = manager._preemption
    assert watch is not None
    real_pid = os.getpid()
    with monkeypatch.context() as patch:
        patch.setattr(os, "getpid", lambda: real_pid + 1)
        signal.raise_signal(signal.SIGTERM)
    assert own_handler == [signal.SIGTERM] and not watch.noticed
    signal.raise_signal(signal.SIGTERM)
    assert watch.noticed
    _multihost._forget_in_child()  # what os.fork runs in the child
    assert not watch.noticed
    manager.close()


_LOOP = """
import os, sys, time, numpy as np, jaxstruct.io as jio
manager = jio.CheckpointManager(sys.argv[1], save_on_preemption=True)
w = np.zeros(4, np.float32)
for step in range(1, 100_000):
    w = w * np.float32(0.5) + np.float32(1.0)
    preempted = manager.reached_preemption(step)
    if step % 1000 == 0 or preempted:
        manager.save(step, {"w": w, "step": step})
    if manager.preempted:
        break
    if step == 3:
        print("running", flush=True)
    time.sleep(0.01)
pid = os.fork()
if pid == 0:  # forked while the watch is open: no notice, and SIGTERM ends it as by default
    assert not manager._preemption.noticed
    os.kill(os.getpid(), 15)
    time.sleep(30)
    os._exit(3)
_, status = os.waitpid(pid, 0)
assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 15, status
manager.close()
print("saved", step, flush=True)
"""


def test_a_sigterm_loop_saves_and_exits_zero(tmp_path: Path) -> None:
    """A real process: SIGTERM mid-training, the step saved, exit 0, resumable exactly."""
    proc = subprocess.Popen(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", _LOOP, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    saved = int(out.split()[-1])
    manager = jio.CheckpointManager(tmp_path)
    assert manager.all_steps() == [saved]
    back = manager.restore()
    w = np.zeros(4, np.float32)
    for _ in range(saved):
        w = w * np.float32(0.5) + np.float32(1.0)
    assert back["step"] == saved and back["w"].tobytes() == w.tobytes()
