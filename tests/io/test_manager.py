"""CheckpointManager: steps, retention by age and by metric, every format, crash safety."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.registry import SerializationError

TIMEOUT = 120


@pytest.mark.parametrize("fmt", ["directory", "zip", "tar"])
def test_save_restore_and_list_in_every_format(fmt: str, tmp_path: Path) -> None:
    """Steps are listed ascending, the newest is restored by default, any format works."""
    manager = jio.CheckpointManager(tmp_path / "run", format=fmt)
    for step in (10, 2, 7):
        manager.save(step, {"w": np.full(3, step), "step": step})
    manager.wait()
    assert manager.all_steps() == [2, 7, 10]
    assert manager.latest_step() == 10
    assert manager.restore()["step"] == 10
    assert manager.restore(2)["step"] == 2


def test_keep_prunes_the_oldest_after_commit(tmp_path: Path) -> None:
    """keep=2 leaves the two newest steps once each save has committed."""
    manager = jio.CheckpointManager(tmp_path / "run", keep=2)
    for step in range(5):
        manager.save(step, {"step": step})
    manager.wait()
    assert manager.all_steps() == [3, 4]
    assert sorted(os.listdir(tmp_path / "run")) == [".metrics", "3", "4"]


def test_keep_the_best_by_metric(tmp_path: Path) -> None:
    """best_metric keeps the best steps (min mode) plus the newest."""
    manager = jio.CheckpointManager(tmp_path / "run", keep=2, best_metric="loss", mode="min")
    for step, loss in enumerate([5.0, 1.0, 3.0, 4.0]):
        manager.save(step, {"step": step}, metrics={"loss": loss})
    manager.wait()
    assert manager.all_steps() == [1, 2, 3]
    assert manager.best_step() == 1
    assert manager.metrics(2) == {"loss": 3.0}


def test_a_diverged_or_damaged_metric(tmp_path: Path) -> None:
    """A NaN loss is kept as a metric; a damaged metrics file (even nested past Python's
    parser) means no metrics for that step, never an exception."""
    manager = jio.CheckpointManager(tmp_path / "run", blocking=True)
    manager.save(1, {"step": 1}, metrics={"loss": float("nan")})
    manager.save(2, {"step": 2}, metrics={"loss": 1.0})
    assert np.isnan(manager.metrics(1)["loss"])  # type: ignore[index]
    (tmp_path / "run" / ".metrics" / "2.json").write_text("[" * 100_000 + "]" * 100_000)
    assert manager.metrics(2) is None
    assert manager.all_steps() == [1, 2]


def test_keep_the_best_in_max_mode(tmp_path: Path) -> None:
    """mode="max" ranks higher metric values first."""
    manager = jio.CheckpointManager(
        tmp_path / "run", keep=1, best_metric="acc", mode="max", blocking=True
    )
    for step, acc in enumerate([0.5, 0.9, 0.7]):
        manager.save(step, {"step": step}, metrics={"acc": acc})
    assert manager.all_steps() == [1, 2]


def test_restore_into_target_shardings(tmp_path: Path) -> None:
    """restore(target=...) places arrays like load(target=...)."""
    manager = jio.CheckpointManager(tmp_path / "run")
    manager.save(1, {"w": jnp.arange(8.0, dtype=jnp.float32)})
    sharding = NamedSharding(jax.make_mesh((8,), ("x",)), P("x"))
    back = manager.restore(target={"w": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharding)})
    assert back["w"].sharding == sharding


def test_missing_and_duplicate_steps(tmp_path: Path) -> None:
    """Restoring an unknown step is FileNotFoundError; saving a step twice FileExistsError."""
    manager = jio.CheckpointManager(tmp_path / "run", blocking=True)
    with pytest.raises(FileNotFoundError, match="no checkpoint saved yet"):
        manager.restore()
    manager.save(1, {"a": 1})
    with pytest.raises(FileNotFoundError, match=r"no step 5; the saved steps are \[1\]"):
        manager.restore(5)
    with pytest.raises(FileExistsError, match="step 1 is already saved"):
        manager.save(1, {"a": 2})


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    """keep, mode and step are checked with clear errors."""
    with pytest.raises(SerializationError, match="keep must be a positive int"):
        jio.CheckpointManager(tmp_path, keep=0)
    with pytest.raises(SerializationError, match="mode must be 'min' or 'max'"):
        jio.CheckpointManager(tmp_path, mode="best")
    with pytest.raises(SerializationError, match="step must be a non-negative int"):
        jio.CheckpointManager(tmp_path).save(-1, {})


def test_background_failure_is_raised_by_the_next_call(tmp_path: Path) -> None:
    """A save that fails in the background raises from wait()."""
    manager = jio.CheckpointManager(tmp_path / "run")

    class Unstorable:
        pass

    with pytest.raises(SerializationError, match="Unstorable"):
        manager.save(1, {"x": Unstorable()})  # encoding fails before returning
    manager.save(2, {"x": 1})
    manager.wait()
    assert manager.all_steps() == [2]


_CHILD = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import jaxstruct.io as jio
    from jaxstruct.io import _publish

    manager = jio.CheckpointManager(sys.argv[1], keep=1, format=sys.argv[2])
    manager.save(1, {"w": np.arange(10)})
    manager.wait()

    def hook(name):
        print(name, flush=True)
        if name == sys.argv[3]:
            time.sleep(600)

    _publish.STEP_HOOK = hook
    manager.save(2, {"w": np.arange(1_000_000)})
    manager.wait()
    """
)


@pytest.mark.parametrize(("fmt", "at"), [("directory", "arrays-written")])
def test_kill_mid_save_keeps_older_steps(fmt: str, at: str, tmp_path: Path) -> None:
    """kill -9 during a save leaves the previous step listed and loadable."""
    run = tmp_path / "run"
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(run), fmt, at], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() == at:
                    break
            else:
                pytest.fail(f"the child exited before reaching {at!r}")
            proc.send_signal(signal.SIGKILL)
            proc.wait(TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(TIMEOUT)
    manager = jio.CheckpointManager(run, keep=1, format=fmt)
    assert manager.all_steps() == [1]
    np.testing.assert_array_equal(manager.restore()["w"], np.arange(10))
    manager.save(2, {"w": np.arange(3)})  # the debris does not block the next save
    manager.wait()
    assert manager.all_steps() == [2]


@pytest.mark.parametrize("url", ["gs://bucket/run", "memory://run"])
def test_a_url_is_refused_before_anything_is_written(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL is not turned into a local folder named 'gs:'; the error says what to do."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SerializationError, match=r'local path.*format="orbax"'):
        jio.CheckpointManager(url)
    assert list(tmp_path.iterdir()) == []


def test_files_and_folders_it_did_not_write_are_never_steps(tmp_path: Path) -> None:
    """A user's own folder or file named like a step is not listed, restored or pruned."""
    root = tmp_path / "run"
    root.mkdir()
    (root / "1").mkdir()
    (root / "1" / "notes.txt").write_text("mine")
    (root / "2").write_text("mine too")
    manager = jio.CheckpointManager(root, keep=1, blocking=True)
    assert manager.all_steps() == []
    manager.save(10, {"w": np.ones(2)})
    manager.save(11, {"w": np.ones(2)})
    assert manager.all_steps() == [11]
    assert (root / "1" / "notes.txt").read_text() == "mine"
    assert (root / "2").read_text() == "mine too"


def test_metrics_exist_only_beside_their_step(tmp_path: Path) -> None:
    """A failed save leaves no metrics; the step saved again without metrics has none, so
    best_metric retention never ranks a step by a stale number."""
    manager = jio.CheckpointManager(tmp_path / "run", keep=1, best_metric="loss", blocking=True)
    with pytest.raises(SerializationError):
        manager.save(1, {"f": print}, metrics={"loss": 0.001})
    assert manager.all_steps() == [] and manager.metrics(1) is None
    manager.save(1, {"w": np.zeros(2)})
    manager.save(2, {"w": np.ones(2)}, metrics={"loss": 0.5})
    manager.save(3, {"w": np.ones(2)}, metrics={"loss": 0.4})
    assert manager.metrics(1) is None
    assert manager.all_steps() == [3] and manager.best_step() == 3


def test_metrics_folder_removed_by_hand_is_made_again(tmp_path: Path) -> None:
    manager = jio.CheckpointManager(tmp_path / "run", blocking=True)
    shutil.rmtree(tmp_path / "run" / ".metrics")
    manager.save(1, {"w": np.ones(2)}, metrics={"loss": 0.5})
    assert manager.metrics(1) == {"loss": 0.5}


def test_a_manager_on_a_file_is_our_error(tmp_path: Path) -> None:
    """CheckpointManager(path of a file) is a SerializationError naming the path (it was a raw
    NotADirectoryError)."""
    (tmp_path / "file").write_bytes(b"x")
    for where in (tmp_path / "file", tmp_path / "file" / "below"):
        with pytest.raises(SerializationError, match=r"is a file, not a directory") as info:
            jio.CheckpointManager(where)
        assert str(where) in str(info.value)
