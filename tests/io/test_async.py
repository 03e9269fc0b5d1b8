"""Non-blocking export: handles, atomic appearance, errors, ordering and input safety."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io import _publish
from jaxstruct.registry import SerializationError

TIMEOUT = 60


class _Gate:
    """Holds background writes at one step boundary until released."""

    def __init__(self, at: str) -> None:
        self.at = at
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, name: str) -> None:
        if name == self.at and threading.current_thread() is not threading.main_thread():
            self.reached.set()
            assert self.release.wait(TIMEOUT), "gate never released"


@pytest.fixture
def gate() -> Iterator[_Gate]:
    """Stop background writes once their temporary checkpoint is complete."""
    hook = _Gate("temp-synced")
    _publish.STEP_HOOK = hook
    try:
        yield hook
    finally:
        hook.release.set()
        _publish.STEP_HOOK = None


def test_handle_waits_and_reports_done(tmp_path: Path) -> None:
    """export(blocking=False) returns a handle; after wait() it is done and the file loads."""
    handle = jio.export({"w": np.arange(4)}, tmp_path / "ck.zip", blocking=False)
    assert isinstance(handle, jio.ExportHandle)
    handle.wait(TIMEOUT)
    assert handle.done()
    np.testing.assert_array_equal(jio.load(handle.path)["w"], np.arange(4))


def test_checkpoint_appears_only_when_complete(tmp_path: Path, gate: _Gate) -> None:
    """While the background write runs, nothing is at the target path."""
    handle = jio.export({"w": np.arange(4)}, tmp_path / "ck", blocking=False)
    assert gate.reached.wait(TIMEOUT)
    assert not (tmp_path / "ck").exists() and not handle.done()
    gate.release.set()
    handle.wait(TIMEOUT)
    assert (tmp_path / "ck").is_dir()


def test_background_error_is_raised_by_wait(tmp_path: Path) -> None:
    """A disk error in the background write surfaces from wait() as CheckpointWriteError."""

    def fail(name: str) -> None:
        if name == "temp-synced":
            raise OSError(28, "No space left on device")

    _publish.STEP_HOOK = fail
    try:
        handle = jio.export({"w": np.arange(4)}, tmp_path / "ck", blocking=False)
        with pytest.raises(jio.CheckpointWriteError, match="No space left"):
            handle.wait(TIMEOUT)
    finally:
        _publish.STEP_HOOK = None
    assert handle.done() and not (tmp_path / "ck").exists()


def test_next_export_to_the_same_path_waits(tmp_path: Path, gate: _Gate) -> None:
    """An export to a path with a write in flight starts only after that write finished."""
    first = jio.export({"v": 1}, tmp_path / "ck", blocking=False)
    assert gate.reached.wait(TIMEOUT)
    finished = threading.Event()

    def second() -> None:
        jio.export({"v": 2}, tmp_path / "ck", overwrite=True)
        finished.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not finished.wait(0.3)
    gate.release.set()
    thread.join(TIMEOUT)
    first.wait(TIMEOUT)
    assert finished.is_set() and jio.load(tmp_path / "ck") == {"v": 2}


def test_mutating_a_numpy_input_after_return_is_safe(tmp_path: Path, gate: _Gate) -> None:
    """The checkpoint holds the values at call time, even if the caller then mutates them."""
    arr = np.arange(6.0)
    handle = jio.export({"w": arr}, tmp_path / "ck", blocking=False)
    arr[:] = -1
    gate.release.set()
    handle.wait(TIMEOUT)
    np.testing.assert_array_equal(jio.load(tmp_path / "ck")["w"], np.arange(6.0))


def test_donating_a_jax_input_after_return_is_safe(tmp_path: Path, gate: _Gate) -> None:
    """The checkpoint holds the values at call time, even if the caller donates the array."""
    arr = jnp.arange(6.0, dtype=jnp.float32)
    handle = jio.export({"w": arr}, tmp_path / "ck", blocking=False)
    jax.jit(lambda x: x + 1, donate_argnums=0)(arr).block_until_ready()
    assert arr.is_deleted()
    gate.release.set()
    handle.wait(TIMEOUT)
    np.testing.assert_array_equal(np.asarray(jio.load(tmp_path / "ck")["w"]), np.arange(6.0))


def test_deleted_array_is_refused(tmp_path: Path) -> None:
    """Exporting an already donated array is a SerializationError naming its path."""
    arr = jnp.arange(3.0, dtype=jnp.float32)
    jax.jit(lambda x: x * 2, donate_argnums=0)(arr).block_until_ready()
    with pytest.raises(SerializationError, match=r"root\['w'\].*deleted"):
        jio.export({"w": arr}, tmp_path / "ck")


# A script that starts background saves and ends without waiting for them.
_ENDS_WITHOUT_WAITING = """
import sys
from pathlib import Path
import jax.numpy as jnp
import jaxstruct.io as jio
root = Path(sys.argv[1])
state = {"w": jnp.arange(2_000_000, dtype=jnp.float32)}
jio.export(state, root / "final", blocking=False)
manager = jio.CheckpointManager(root / "run", keep=3)
for step in range(2):
    manager.save(step, {"w": state["w"] + step})
"""


def test_background_saves_still_running_at_exit_finish(tmp_path: Path) -> None:
    """A script that ends while its blocking=False export and manager saves still run:
    they finish (at interpreter exit the worker pools take no more work, so the rest
    runs on the saving thread), and every checkpoint loads."""
    proc = subprocess.run(
        [sys.executable, "-c", _ENDS_WITHOUT_WAITING, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    want = np.arange(2_000_000, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(jio.load(tmp_path / "final")["w"]), want)
    manager = jio.CheckpointManager(tmp_path / "run")
    assert manager.all_steps() == [0, 1]
    np.testing.assert_array_equal(np.asarray(manager.restore(1)["w"]), want + 1)
